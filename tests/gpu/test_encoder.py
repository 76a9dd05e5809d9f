"""Encoder utilization: NVML's [percent, period] as a ratio; absent where unsupported."""

from exporters import catalog as c
from tests.gpu.helpers import make_loop, parse, render, static_fake, value, values


def test_encoder_utilization_is_a_ratio_and_absent_when_unsupported() -> None:
    fake = static_fake(2)
    fake.update(lambda s: (
        s["gpus"][0].update(nvml={"nvmlDeviceGetEncoderUtilization": [40, 167000]}),
        s["gpus"][1].update(not_supported=["nvmlDeviceGetEncoderUtilization"])))
    loop = make_loop(fake, watch_xid=False)
    loop.run_once()
    series = parse(render(loop))
    assert value(series, c.GPU_ENCODER_UTILIZATION, gpu="0") == 0.4
    assert values(series, c.GPU_ENCODER_UTILIZATION, gpu="1") == []

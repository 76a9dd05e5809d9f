"""Fan speed: NVML's percent as a ratio; absent where the board has no fan."""

from exporters import catalog as c
from tests.gpu.helpers import make_loop, parse, render, static_fake, value, values


def test_fan_speed_is_a_ratio_and_absent_without_a_fan() -> None:
    fake = static_fake(2)
    fake.update(lambda s: (s["gpus"][0].update(nvml={"nvmlDeviceGetFanSpeed": 45}),
                           s["gpus"][1].update(not_supported=["nvmlDeviceGetFanSpeed"])))
    loop = make_loop(fake, watch_xid=False)
    loop.run_once()
    series = parse(render(loop))
    assert value(series, c.GPU_FAN_SPEED, gpu="0") == 0.45
    assert values(series, c.GPU_FAN_SPEED, gpu="1") == []

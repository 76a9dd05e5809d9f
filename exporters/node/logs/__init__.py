"""The log scanner: follows rank logs and the kernel ring buffer, classifies failure lines
(`patterns`) and exports them as metrics (`trainwatch-logscan`)."""

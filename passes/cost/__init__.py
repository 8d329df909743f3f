"""Cost oracles: ``oracle.py`` prices one op signature (analytic roofline profiles, onnxruntime
measurements on the CPU); ``latency.py`` times whole models side by side (the latency check)."""

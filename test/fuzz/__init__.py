"""The project's random-graph differential fuzzer for ``taso-opt --taso-search`` (issue 19).

``gen`` builds seeded, valid ONNX models from motifs; ``runner`` optimizes them with the CLI's own
``main()`` in a long-lived child process and compares input and output in onnxruntime against a
float64 reference; ``shrink`` reduces a failing model; ``campaign`` runs a seed range. Not installed:
put ``test/`` on ``sys.path`` and ``import fuzz`` (``test/unit/test_fuzz.py`` does), or run
``python test/fuzz/campaign.py``.
"""

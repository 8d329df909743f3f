"""The search: the ``taso-search`` pipeline (``taso_search.py``), TASO's backtracking search over the
in-memory graph (``backtracking.py``, ``tgraph.py``), the rule library (``rulebook.py``), PDL emission and
the replay of the chosen rewrites on the IR (``pdl.py``), and the matmul flattening that lets 2-D rules
see 3-D projections (``flatten_matmul.py``)."""

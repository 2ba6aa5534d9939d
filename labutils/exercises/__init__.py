"""Layer 6: every exercise checker, one module per lab (``labXX``), on the framework in ``base``.
The course map (``labutils.course``) names each lab's checkers; ``lu.check_<name>`` finds them
through it."""

"""fairseq tasks: each module registers its task when imported (``lsg_fairseq``'s ``__init__``
imports them all), except ``eval_rouge``, the ``--eval-rouge`` helper of the tasks, which registers
nothing."""

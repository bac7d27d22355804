"""fairseq models: each module registers its model and architectures when imported (``lsg_fairseq``'s
``__init__`` imports them all); the modules the BART-shaped models share (``long_input_bart``,
``custom_encoder``, ``long_source_decoder``, ``weight_init``, ``layer_wrap``) register nothing."""

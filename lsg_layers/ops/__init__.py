"""Pure tensor functions the layers are built from, no modules and no state: block and band index
arithmetic shared by LSG and LED (``blocks.py``), LSG's sparse sequences (``sparse.py``), the
windowed attention kernel of the CPU path (``window_attention.py``), rows gathered by a fixed index
with a backward that sums each row's readers (``fan_in.py``), LSG's and LED's patterns as
FlexAttention masks (``flex.py``; it keeps the compiled kernel), S4D kernel math and the FFT
convolution (``ssm.py``); what the compiled ones share (``compiling.py``)."""

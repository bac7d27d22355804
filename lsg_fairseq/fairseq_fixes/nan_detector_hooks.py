"""fairseq's NanDetector on encoders that return a dict of lists (no upstream issue found).

When a training step's gradients are NaN/Inf, fairseq's trainer reruns the step under
``NanDetector``, which logs the first module whose output (forward) or gradient (backward) holds a
NaN or Inf, then the parameters' norms. It hooks every module, backward with torch's legacy
``register_backward_hook``; for such a hook torch's ``Module._call_impl`` looks for a tensor in
the module's output, and fairseq's encoders (stock and this plugin's) return
``{"encoder_out": [tensor], ...}``, a dict of lists: no tensor found, ``StopIteration``. The rerun
dies when the encoder returns, so the decoder's forward, every backward report and the norms are
never logged, and a StopIteration traceback lands on top of the FloatingPointError. The fix hooks
backward on leaf modules only (each returns a tensor, and every parameter's gradient passes through
one); forward hooks stay on every module, as before.
"""

from fairseq import nan_detector

from lsg_fairseq.fairseq_fixes._wrap import wrap


def _leaf_backward_hooks(original):
    def add_hooks(self, module):
        if self.forward:
            self.fhooks.append(module.register_forward_hook(self.fhook_fn))
        if self.backward and next(module.children(), None) is None:
            self.bhooks.append(module.register_backward_hook(self.bhook_fn))

    return add_hooks


def install() -> None:
    wrap(nan_detector.NanDetector, "add_hooks", _leaf_backward_hooks)

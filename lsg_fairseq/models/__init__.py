"""fairseq registrations: every module here is imported (and registers itself) on package import."""
import os

from lsg_fairseq._autoimport import import_all

import_all(__name__, os.path.dirname(__file__))

"""Root conftest: only what the repository's own tests need."""
# pytester's in-process runs restore sys.modules afterwards, dropping whatever the inner run imported; numpy's
# and scipy's C extensions cannot be loaded twice in one process, so a second in-process run that fits a latency
# model would fail with "cannot load module more than once". Importing them here puts them in the snapshot.
import numpy.fft  # noqa: F401
import scipy.optimize  # noqa: F401

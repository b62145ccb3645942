# The compiled KV port's calls as C functions: what blis_sim.kv._core.RequestPort.c_calls holds (a
# capsule of PortCalls) and the compiled step loop (blis_sim.engine._loop) calls instead of the
# port's Python methods, with the same effects and results, but no Python object per argument and
# result (~130,000 calls for 10,000 requests).
from libc.stdint cimport int64_t

# An admission (the fields of blis_sim.kv.cache.Admission)
cdef struct Admitted:
    int64_t computed, gpu, external, host, disk
    double ready

# Each takes the port (a RequestPort) and a request index; ``except -1``: a Python exception
# (a request the port does not know, a simulation error) propagates as from the methods.
ctypedef struct PortCalls:
    # lookup(i, now): the GPU and external tokens found (port.lookup's first two)
    int (*lookup)(object port, int64_t i, double now, int64_t* gpu, int64_t* external) except -1
    # admit(i, num_new_tokens, now): 1 admitted (into ``out``), 0 no room (port.admit's None)
    int (*admit)(object port, int64_t i, int64_t num_new_tokens, double now, Admitted* out) except -1
    # grow(i, num_new_tokens): 1 grown, 0 no room
    int (*grow)(object port, int64_t i, int64_t num_new_tokens) except -1
    int (*computed)(object port, int64_t i, double now) except -1
    int (*preempt)(object port, int64_t i) except -1
    int (*finish)(object port, int64_t i) except -1

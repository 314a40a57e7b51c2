# What _columns shares with the other compiled decoders (_scan): the argument checks of every decode and scan.
from libc.stdint cimport uint8_t

cdef const uint8_t[::1] record_bytes(data, Py_ssize_t start, Py_ssize_t *end)
cdef tuple unit_arrays(positions, sizes, bint sizes_required)

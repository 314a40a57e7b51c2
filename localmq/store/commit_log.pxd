from libc.stdint cimport int32_t, int64_t, uint8_t
from localmq._mapped_file cimport MappedFile
from localmq._os cimport lmq_event
from localmq.store.group_commit cimport GroupCommit
from localmq.store.put_args cimport PutExtra, TopicEntry
from localmq.store.shared_commit cimport SharedCommit

cdef extern from "<pthread.h>" nogil:
    # the put lock: a plain mutex, whose uncontended lock and unlock cost about 60 instructions where Python's lock
    # read the monotonic clock on every acquire (about 140; perf/README.md, issue 29)
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_init(pthread_mutex_t *, const void *)
    int pthread_mutex_destroy(pthread_mutex_t *)
    int pthread_mutex_lock(pthread_mutex_t *)
    int pthread_mutex_trylock(pthread_mutex_t *)
    int pthread_mutex_unlock(pthread_mutex_t *)

cdef class CommitLog:
    cdef readonly object mapped_file_queue
    cdef readonly int64_t file_size
    cdef MappedFile cur
    cdef pthread_mutex_t lock          # the put lock (process-local; shared stores add the control file's)
    cdef bint lock_ready
    cdef dict topics
    cdef str last_topic               # the topic of the last _topic() call (identity), and its entry
    cdef TopicEntry last_te
    cdef dict props_cache
    cdef bytes store_host
    cdef bytes born_host
    cdef int32_t host_sys_flag
    cdef readonly int64_t max_message_size
    cdef int64_t last_store_ts
    cdef lmq_event *dispatch_event           # dispatch_event_owner.ev
    cdef object dispatch_event_owner
    cdef readonly bint closed
    cdef readonly bint forked        # set in a forked child: every put raises ForkedStoreError
    cdef object __weakref__
    cdef GroupCommit group_commit     # SYNC_FLUSH: puts wait on it for their bytes to be flushed (else None)
    cdef int64_t sync_flush_timeout_us
    cdef public object create_failed_hook
    # topic -> [(queue id, next queue offset)] asked on a topic's first put (ConsumeQueueTable.next_offsets: queues
    # a snapshot vouched for, checked then), or None
    cdef public object topic_miss
    # None, or the PutStatus every put answers without writing (retention's disk-full flag: SERVICE_NOT_AVAILABLE)
    cdef public object refuse_status
    cdef readonly long long puts
    cdef SharedCommit shared          # a store shared between processes: its commit protocol, else None
    cdef char *cb                     # shared.cb, the control file's mapping (NULL: this process alone writes)
    cdef bint shared_sync             # SYNC_FLUSH in a shared store: wait on the housekeeper's group commit
    cdef int64_t synced_end           # the committed end sync_view last moved this view to
    cdef readonly long long put_failures
    cdef object failure_cause           # the refused put's cause logged last (logged once until it clears), or None
    cdef public object last_failure     # why the last put failed for lack of disk (what, how much, where), or None
    # the StoreIOError of the first failed flush of the log (fail_sync), or None: from then on every put answers
    # SERVICE_NOT_AVAILABLE (nothing is written) until the store is closed and opened again
    cdef readonly object sync_failure
    cdef bint sync_failed
    cdef TopicEntry _topic(self, str topic)
    cdef bytes _properties(self, object tags, object keys, object properties)
    cdef MappedFile _roll(self, int64_t start)
    cdef bint _failure_is_new(self, object cause)
    cdef int _failure_cleared(self) except -1
    cdef bint _reserve(self, MappedFile mf, int64_t end)
    cdef _await_flush(self, object r, int64_t end)
    cdef object _closed_error(self)
    cdef object _put(self, str topic, object body, object queue_id, object tags, object keys, object properties,
                     object flag, PutExtra extra)
    cdef object _put_batch(self, str topic, object bodies, object queue_id, object tags, object keys,
                           object properties, object flag)

// The observe layer's private header: what the assembler (src/nofrag.c)
// attaches to a pool. record.c: the `trace:PATH` recorder; monitor.c: the
// shared-memory file the core's counters are published into
// (monitor_shm.h); snapshot.c: nf_snapshot and the OOM report. Each is
// reached by the core only through the hooks in nf_pool_t.
#ifndef NF_OBSERVE_H
#define NF_OBSERVE_H

#include "core/core.h"
#include "observe/monitor_shm.h"

// record.c: `trace:PATH` writes every successful nf_alloc and every nf_free to
// PATH as an RMM logging_resource_adaptor CSV log, buffered (64 KiB) and
// written with write(2) under the pool lock, at most cfg.trace_max bytes.
nf_status_t nf__rec_open(nf_pool_t *p);  // at pool creation when cfg.trace[0]; error names the path
void nf__rec_close(nf_pool_t *p);        // at destroy: flush, close, free
void nf__rec_row(nf_pool_t *p, bool alloc, uintptr_t ptr, uint64_t size, nf_stream_t stream); // obs.op

// monitor.c: at pool creation, unless NOFRAG_MONITOR=0; sets p->pub (a
// failure leaves it NULL: no monitor file is not an error).
void nf__mon_open(nf_pool_t *p);
void nf__mon_close(nf_pool_t *p); // at destroy: unmap and unlink

// snapshot.c: build the multi-line OOM report into this thread's buffer
// (nf_last_oom_report), under the pool lock. `too_large`: the request exceeds
// the whole limit (nothing was tried). Returns true when the caller should
// print it to stderr with nf__oom_print once the lock is released (first OOM
// of a burst, NOFRAG_QUIET_OOM unset). obs.oom / obs.oom_print.
bool nf__oom_report(nf_pool_t *p, uint64_t size, nf_stream_t s, bool too_large);
void nf__oom_print(void);

#endif

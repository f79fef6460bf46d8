// Internal to the host backend (host.c: memory ops; host_maps.c: the bound on
// mappings; host_event.c: events and work in flight; host_share.c: export /
// import): its records and the backend object. See host.c for the model.
#ifndef NF_HOST_H
#define NF_HOST_H

#include "backend.h"

#include <pthread.h>
#include <sys/types.h>
#include <stdbool.h>
#include <stdint.h>

enum { REC_FREE = 0, REC_LIVE = 1, REC_RELEASED = 2 }; // RELEASED: freed by user, still mapped
enum { EVENT_MAGIC = 0x4E464556u };                    // "NFEV"
enum { NTIERS = 2 };                                   // device, host (disk unsupported)

// Per-granule slot of a reserved range: 0 = unmapped, else
// (record index + 1) << 2 | SLOT_ACCESS (set_access done) | SLOT_START (first
// granule of a mapping: unmap may not cut a mapping in the middle).
#define SLOT_START 1u
#define SLOT_ACCESS 2u
#define SLOT_REC(s) (((s) >> 2) - 1)
#define MAX_RECS ((1u << 30) - 1) // record index + 1 must fit a slot's 30 bits

typedef struct {
  uint64_t off, size; // extent in the tier's memfd
  uint32_t gen;       // bumped whenever the record is freed
  uint32_t maps;      // live mappings of this handle
  uint32_t next_free; // free-list link (index + 1, 0 = end)
  int ext_fd;         // imported from another process (mem_import): its fd, else -1
  uint8_t tier, state;
} mem_rec;

typedef struct {
  uint64_t off, len;
} extent;

typedef struct {
  int fd;           // -1 until the tier is first used
  uint64_t created; // bytes of extents in use (released-but-mapped included)
  extent *free;     // free extents of the memfd, sorted by offset, coalesced
  size_t nfree, capfree;
} tier_state;

typedef struct {
  uintptr_t base;
  size_t size;
  size_t mapped;  // mapped granules in the range
  uint32_t *slot; // one per granule (see SLOT_*)
} va_range;

typedef struct host_event {
  uint32_t magic;
  bool done;
  uint64_t gen; // record order, to complete earlier events of a stream on sync
  nf_stream_t stream;
  struct host_event *prev, *next;
} host_event;

typedef struct {
  nf_backend_t base;
  pthread_mutex_t mu;
  uint64_t capacity, granule;
  tier_state tiers[NTIERS];
  mem_rec *recs;
  size_t nrecs, caprecs;
  uint32_t free_rec; // head of the record free list (index + 1)
  va_range *ranges;  // sorted by base
  size_t nranges, capranges;
  host_event *events; // every live event, for complete_events and destroy
  uint64_t event_gen;
  int manual;
  uint64_t live_granules, mapped_granules;
  uint64_t n_maps;   // mappings (map calls) held: each is at least one kernel memory mapping
  uint64_t max_maps; // NOFRAG_HOST_MAX_MAPS: stands in for vm.max_map_count (tests); 0 = none
  void *spare;       // a page mapped outside every range, given up when the mapping bound refuses an unmap (host.c)
  size_t page;
  // Work in flight (host_event.c, manual mode): ranges streams were declared
  // to use, per stream the newest event known complete, and the stream waits
  // that order one stream's work after another's.
  struct host_use *uses;
  size_t nuses, capuses;
  struct host_done *dones;
  size_t ndones, capdones;
  struct host_dep *deps; // cross-stream waits: a stream's later events imply another's earlier work done
  size_t ndeps, capdeps;
  uint64_t violations; // unmaps of a range while a stream could still be using it
  // The creating process. A fork()ed child shares the memfds (one open file
  // description) but has its own copy of the extent lists: it must neither
  // punch holes (the parent's live data would read as zeros) nor hand out
  // extents (the parent may hand out the same ones), as a CUDA context is not
  // usable in a child either.
  pid_t pid;
} host_backend;

static inline host_backend *hb(nf_backend_t *be) { return (host_backend *)be; }

// host_event.c: the event ops (streams run nothing; manual mode keeps events
// pending until the test completes them).
nf_status_t nf__host_event_create(nf_backend_t *be, nf_event_t *out);
nf_status_t nf__host_event_destroy(nf_backend_t *be, nf_event_t ev);
nf_status_t nf__host_event_record(nf_backend_t *be, nf_event_t ev, nf_stream_t s);
nf_status_t nf__host_event_query(nf_backend_t *be, nf_event_t ev);
nf_status_t nf__host_event_sync(nf_backend_t *be, nf_event_t ev);
nf_status_t nf__host_stream_wait(nf_backend_t *be, nf_stream_t s, nf_event_t ev);
nf_status_t nf__host_sync(nf_backend_t *be); // every event complete (manual mode: the work held finishes)
void nf__host_event_free(host_backend *h, host_event *e); // unlink and free, under the lock
// unmap: count a violation per declared use of [va, va + size) not known complete (under the lock)
void nf__host_uses_check(host_backend *h, uintptr_t va, size_t size);
// copy: in manual mode, both ranges are s's work in flight until an event behind it completes (under the lock)
void nf__host_copy_use(host_backend *h, nf_stream_t s, uintptr_t dst, uintptr_t src, size_t n);
uint64_t nf__host_phys(host_backend *h, uintptr_t va, size_t *n); // physical run under va (0: unmapped), *n cut
void nf__host_uses_free(host_backend *h); // destroy
// *arr holds at least `need` elements of `elem` bytes (doubling); false: out of memory, unchanged.
bool nf__host_grow(void **arr, size_t *cap, size_t need, size_t elem);
host_backend *nf__host_of(nf_backend_t *be); // the host backend behind be (through fault wrappers), or NULL
// host_maps.c: the bound on mappings (vm.max_map_count, or NOFRAG_HOST_MAX_MAPS).
void nf__host_map_bound_init(void);                                      // read vm.max_map_count (once)
nf_status_t nf__host_map_room(nf_backend_t *be, uint64_t n);             // the map_room op
nf_status_t nf__host_fail_enomem(host_backend *h, const char *op);       // ENOMEM: name the bound and the remedy
void *nf__host_spare_new(host_backend *h);                               // a spare page outside every range, or NULL
int nf__host_reserve_again(host_backend *h, uintptr_t va, size_t size);  // PROT_NONE back over mapped runs: 0 or errno
// host.c: a live record for a handle (NULL: unknown or released); a free record slot (NULL: out of memory).
// Under the lock.
mem_rec *nf__host_rec_of(host_backend *h, nf_handle_t hd, uint32_t *idx);
mem_rec *nf__host_rec_new(host_backend *h, uint32_t *idx);
// host_share.c: the sharing ops.
nf_status_t nf__host_mem_export(nf_backend_t *be, nf_handle_t hd, int *fd, uint64_t *off);
nf_status_t nf__host_mem_import(nf_backend_t *be, int fd, uint64_t off, size_t size, nf_handle_t *out);

#endif

//! nofrag — device memory that does not fragment.
//!
//! Physical memory is a pool of granules (G bytes each: 2 MiB on CUDA). Virtual
//! address space is reserved in large ranges and carved into 512-byte aligned
//! blocks. A virtual granule is mapped while any live block overlaps it; free
//! mapped granules are the cache. When the pool is at its limit, granules that
//! lie wholly inside free ranges are unmapped and re-mapped where a request
//! needs them ("stitching"), so a request fails only when live memory really
//! does not fit.
//!
//! **Guarantee.** With limit L, an allocation of s bytes succeeds whenever
//!
//!     (granules overlapped by live blocks) + ceil(s/G) + 1  <=  L/G
//!
//! whatever the history of allocations and frees (blocks freed but still in
//! use by a stream count as live until their work completes; the allocator
//! waits for that work before it fails). With mapping units (config `units`,
//! off by default) a live block overlaps every granule of each unit it lies
//! on: a unit moves only whole.
//!
//! Thread safety: every function taking a pool may be called from any thread;
//! each pool has its own lock. Errors: functions return an `nf_status_t`; the
//! allocation functions also leave a thread-local message (`nf_last_error`).
#ifndef NOFRAG_H
#define NOFRAG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NF_API __attribute__((visibility("default")))
#else
#define NF_API
#endif

//! The release version, and its only home: CMake (project VERSION, nofrag.pc,
//! the CMake package), setup.py and nofrag.__version__ read it from this line.
#define NF_VERSION "0.1.0"

//! Status codes. 0 is success; every other value leaves the pool's blocks,
//! data and physical memory as they were. (What a failed allocation's
//! stitching unmapped on its way to NF_ERR_OOM stays unmapped: free cached
//! memory, which the next request maps again where it needs it.)
typedef enum nf_status_e {
  NF_OK = 0,
  NF_ERR_INVALID = 1,     //!< bad argument: unknown or interior pointer, double free, absurd size
  NF_ERR_OOM = 2,         //!< live memory does not fit under the limit
  NF_ERR_BACKEND = 3,     //!< the backend (driver, OS) failed; message carries its error
  NF_ERR_CONFIG = 4,      //!< malformed configuration string or value
  NF_ERR_UNSUPPORTED = 5, //!< backend or feature not available here (e.g. no CUDA driver)
  NF_ERR_NOMEM = 6,       //!< host metadata allocation (malloc) failed
  NF_ERR_NOT_READY = 7,   //!< an event has not completed yet (backend-level only)
  NF_ERR_FOREIGN = 8,     //!< the pointer lies outside every address range of the pool (only from a
                          //!< probing free: nf_free_ex with NF_FREE_PROBE; no message is set)
} nf_status_t;

//! Physical memory tiers. Granules carry a tier; device is the default.
typedef enum nf_tier_e {
  NF_TIER_DEVICE = 0,
  NF_TIER_HOST = 1,          //!< host memory mapped at the block's address (usable in place)
  NF_TIER_DISK = 2,          //!< a file; the range is unmapped while away
  NF_TIER_HOST_DETACHED = 3, //!< host memory, the range unmapped while away (cheaper moves)
} nf_tier_t;

//! Opaque stream handle (a `CUstream`/`cudaStream_t` on CUDA; any value on the
//! host backend). NULL is the default stream. On CUDA a stream must belong to
//! the pool's device's primary context (the runtime's, PyTorch's, CuPy's): the
//! pool records its events on it. Another context's stream (another device's)
//! is refused, NF_ERR_INVALID, by the first call that passes it. Streams are
//! known by handle, and a pool may record events on a stream it knows at any
//! time after a free on it (lazily: when another stream wants the memory, or
//! before unmapping it), so a stream must stay alive while the pool knows it:
//! destroy it only after the pool is destroyed or once nf_stream_known says
//! the pool forgot it (a record on a destroyed stream is undefined in CUDA: it
//! failed, and likely crashed, on an H100). A pool keeps 64 streams; when a
//! 65th comes, it forgets those that no live or pending block names, after one
//! wait for the whole device. If live blocks' allocations name them all, one
//! of the least recently used such streams gives up its slot: one whose work
//! is known complete (no call), else the oldest after one wait on it alone;
//! its live blocks remember it and take a slot again when freed.
//! NF_ERR_UNSUPPORTED only where record_stream'ed, pending or offloaded
//! blocks, private pool routes and captures name every slot, or during a
//! capture.
//! nofrag.cupy keeps CuPy's stream objects alive for exactly as long.
typedef void *nf_stream_t;

typedef struct nf_pool_s nf_pool_t;
typedef struct nf_backend_s nf_backend_t;

//! Size constants for configuration.
#define NF_KiB ((uint64_t)1 << 10)
#define NF_MiB ((uint64_t)1 << 20)
#define NF_GiB ((uint64_t)1 << 30)

//! Longest trace path (NUL included) a config can hold.
#define NF_TRACE_PATH_MAX 256

//! Pool configuration. `nf_config_default` fills defaults; `nf_config_parse`
//! applies a string such as "limit:40GiB,reserve:8GiB,release_threshold:512MiB".
//! A value of 0 for limit means "the backend's capacity".
typedef struct nf_config_s {
  uint64_t limit;             //!< max physical bytes (rounded down to granules); 0 = backend capacity
  uint64_t reserve;           //!< physical bytes created up front at pool creation
  uint64_t release_threshold; //!< cached (mapped, not live) bytes kept before releasing; UINT64_MAX = never,
                              //!< UINT64_MAX-1 = auto (never under an explicit limit, else capacity/4)
  uint64_t retain;            //!< physical bytes (mapped or not) releasing keeps: unmapped granules go back only while more exist
  uint64_t granule;           //!< granule size; 0 = backend's granularity (host backend: settable)
  uint64_t small_max;         //!< requests up to this size are packed apart from large ones
  uint64_t va_chunk;          //!< virtual address space reserved at a time; 0 = 4 x limit, within 1 GiB..1 TiB
  int device;                 //!< device ordinal (CUDA backend)
  int backend;                //!< NF_BACKEND_HOST or NF_BACKEND_CUDA (for nf_pool_create_from_config)
  uint64_t host_capacity;     //!< host backend: simulated device capacity; 0 = 141 GiB
  uint64_t release_after;     //!< cached memory is released once above the threshold for this many
                              //!< frees in a row and release_idle_ms (a decay: what a step's peak
                              //!< uses stays cached; only the part no peak used goes); 0 = at once
  int tight;                  //!< 1: below the limit too, stitch cached granules rather than grow
                              //!< past the live peak + 1/64 (fewer bytes, more backend calls)
  uint64_t trace_max;         //!< trace recording: the file stops growing at this many bytes
                              //!< (recording stops at the first row that would not fit); 0 = no bound
  char trace[NF_TRACE_PATH_MAX]; //!< "" = off; else every successful nf_alloc and every nf_free of
                              //!< the pool is recorded to this file in RMM's logging_resource_adaptor
                              //!< CSV format (replay with `nofrag replay FILE`). Stored in the struct
                              //!< (NUL-terminated, zero-filled) so that configs copy by value.
  int spill;                  //!< 1 (`spill:host`): when device granules run out and stitching cannot
                              //!< help, back the rest of a request with host-memory granules (same
                              //!< address, slower) instead of failing; 0 (`spill:off`, default)
  uint64_t spill_limit;       //!< most host bytes spill and nf_offload may hold; 0 = the host tier's
                              //!< capacity as the backend reports it (MemTotal on CUDA)
  uint64_t spill_reserve;     //!< host bytes created at pool creation and kept by nf_trim: pinned host
                              //!< memory is slow to create (on the H200 a first spill of 11 GiB took 8 s)
  char offload_dir[NF_TRACE_PATH_MAX]; //!< directory for nf_offload(..., NF_TIER_DISK) files;
                              //!< "" = $TMPDIR, else /tmp. The file is unlinked at creation.
  uint64_t views;             //!< most parked views (a granule kept mapped where it served before, so
                              //!< that serving there again costs no map call) before idle ones (their
                              //!< work known complete; in address order) are unmapped; 0 = views off
  uint64_t release_idle_ms;   //!< ... and for this long (pool clock, ms): a training step slower than
                              //!< release_after frees must not give back what its next peak needs
  uint64_t units;             //!< growth creates the interior of a large block in physical allocations
                              //!< of this many granules, each mapped in one call (a mapping's driver
                              //!< cost is per mapping, not per byte); 0 or 1 = off (every granule its own).
                              //!< A unit is unmapped only whole: nf_offload moves a unit inside a block
                              //!< whole, and refuses a block over part of one (docs/design.md, "Units")
  int edges;                  //!< 1 (default): at the limit, a request that would fail may start (or end)
                              //!< inside another block's partly used granule, mapped a second time there
                              //!< (edge sharing: the two blocks' bytes stay apart; docs/design.md, "Edge
                              //!< sharing"); 0: such a request fails
} nf_config_t;

#define NF_BACKEND_HOST 0
#define NF_BACKEND_CUDA 1

//! Fill `cfg` with defaults: limit 0 (= backend capacity), reserve 0,
//! release_threshold "auto" (= never under an explicit limit, else capacity/4;
//! UINT64_MAX-1 in the struct, "never" = UINT64_MAX), retain 0, granule 0 (= backend's), small_max 1 MiB,
//! va_chunk 0 (= 4 x limit, 1 GiB..1 TiB), device 0, backend host, release_after 4096, tight 0,
//! trace "" (off), trace_max 256 MiB, spill off, spill_limit 0 (= host capacity), spill_reserve 0,
//! offload_dir "" ($TMPDIR), views 16384, release_idle_ms 10000, units 0.
NF_API nf_status_t nf_config_default(nf_config_t *cfg);

//! Apply a "key:value,key:value" string to `cfg`. Sizes take B/KiB/MiB/GiB/TiB/PiB
//! (binary) or KB/MB/GB/TB/PB (decimal) suffixes. Unknown keys or bad values
//! return NF_ERR_CONFIG with a message in `err` (if non-NULL) and leave `cfg`
//! unchanged. NULL or "" is valid and changes nothing. `trace:PATH` takes the
//! rest of the item as a path (trimmed; it cannot contain ',' and must be
//! shorter than NF_TRACE_PATH_MAX); `trace:` alone turns recording off. The
//! file is opened (created, truncated) by nf_pool_create, which fails with
//! NF_ERR_CONFIG naming the path when it cannot be.
NF_API nf_status_t nf_config_parse(nf_config_t *cfg, const char *str, char *err, size_t errlen);

//! Format `cfg` as a config string (round-trips through nf_config_parse).
NF_API int nf_config_format(const nf_config_t *cfg, char *buf, size_t len);

// ---------------------------------------------------------------- backends

//! Host (CPU) backend: memfd + mmap with the same semantics as CUDA VMM.
//! `capacity` is the simulated device size (untouched memory costs nothing);
//! `granule` its granularity (power of two, multiple of the page size).
NF_API nf_status_t nf_backend_host_create(nf_backend_t **out, uint64_t capacity, uint64_t granule);

//! Host backend test hook: when `manual` is non-zero, recorded events stay
//! incomplete until nf_backend_host_complete_events() is called (or they are
//! synchronized). Default: events complete at once.
NF_API void nf_backend_host_set_manual_events(nf_backend_t *be, int manual);
NF_API void nf_backend_host_complete_events(nf_backend_t *be);
//! Host backend test hook (manual events): stream `s` works on [addr, addr+n)
//! from now until an event recorded on `s` afterwards completes. Unmapping any
//! of it before then is counted (nf_backend_host_violations): the mistake that
//! on a GPU would fault, or write through the next mapping there. In manual
//! mode every copy the allocator queues (offload, prefetch, spill) declares
//! its source and destination this way on its stream.
NF_API void nf_backend_host_use(nf_backend_t *be, nf_stream_t s, const void *addr, size_t n);
//! The same for memory just allocated on `s`: if another stream's declared
//! use of any of it (its addresses, or the physical memory mapped there: a
//! granule may be mapped at several places) is neither complete nor ordered
//! before `s`'s work from now (stream waits on events, transitively), one
//! violation is counted: the new owner would race the old (reuse without
//! ordering).
NF_API void nf_backend_host_use_new(nf_backend_t *be, nf_stream_t s, const void *addr, size_t n);
NF_API uint64_t nf_backend_host_violations(nf_backend_t *be);

//! Host backend: granules currently created and mappings currently live
//! (used by tests to prove that destroy leaves nothing behind).
NF_API void nf_backend_host_usage(nf_backend_t *be, uint64_t *granules, uint64_t *mappings);

//! CUDA backend on the driver's VMM API for `device`; libcuda.so.1 is loaded at
//! run time. Returns NF_ERR_UNSUPPORTED with a message where no driver exists.
//! On a thread with no current CUDA context it makes the device's primary
//! context current (a plain C program's own driver calls then work); a thread
//! that has one keeps it. (The PyTorch plug-in binds nothing: it leaves
//! PyTorch's current device alone.)
NF_API nf_status_t nf_backend_cuda_create(nf_backend_t **out, int device);

//! Fault injection around `inner` (which it then owns): call number
//! `fail_at` (1-based, counting every backend call; 0 = none) fails, and each
//! call fails with probability `p` (xorshift seeded with `seed`).
NF_API nf_status_t nf_backend_fault_create(nf_backend_t **out, nf_backend_t *inner,
                                           uint64_t fail_at, double p, uint64_t seed);
//! Change the fault plan of a fault backend (e.g. to stop failing before destroy).
NF_API void nf_backend_fault_set(nf_backend_t *be, uint64_t fail_at, double p);
//! Number of backend calls the fault wrapper has seen and failed.
NF_API void nf_backend_fault_counts(nf_backend_t *be, uint64_t *calls, uint64_t *failed);

//! Destroy a backend the caller owns (pools never destroy the backend given to
//! nf_pool_create).
NF_API void nf_backend_destroy(nf_backend_t *be);

// ---------------------------------------------------------------- pools

//! Create a pool on `backend` (borrowed: it must outlive the pool). On any
//! failure *out is NULL (where `out` is not) and nothing was created.
NF_API nf_status_t nf_pool_create(nf_pool_t **out, nf_backend_t *backend, const nf_config_t *cfg);

//! Create a pool and its own backend from a config string (NULL: the
//! NOFRAG_CONF environment variable). The backend is destroyed with the pool.
NF_API nf_status_t nf_pool_create_from_string(nf_pool_t **out, const char *conf);

//! Destroy the pool: all mappings, granules and address ranges go back to the
//! backend. Live blocks are dropped (their addresses become invalid). Work
//! still queued on the pool's memory must be complete (synchronize the streams
//! that use it first): unmapping memory a kernel uses faults. The pool waits
//! for the offload copies it tracks itself.
NF_API void nf_pool_destroy(nf_pool_t *pool);

//! Allocate `size` bytes usable on `stream`. Returns NULL on failure with
//! nf_last_status() / nf_last_error() set. `size` 0 returns NULL with NF_OK.
//! Blocks are 512-byte aligned. A request that fails gives back the granules
//! it created on its way (physical memory is what it was before the call).
NF_API void *nf_alloc(nf_pool_t *pool, size_t size, nf_stream_t stream);

//! Free a block. The block's memory may be reused at once on the stream it was
//! allocated on, and on other streams once ordered after that stream's work.
//! Unknown, interior or already freed pointers return NF_ERR_INVALID and
//! change nothing. `ptr` NULL is a no-op. A block whose stream gave up its
//! slot to another (see nf_stream_t) may need a host wait on that stream; its
//! free is refused (NF_ERR_UNSUPPORTED, nothing changed) only during a
//! capture that leaves no slot, and a failed wait returns NF_ERR_BACKEND.
NF_API nf_status_t nf_free(nf_pool_t *pool, void *ptr);

//! nf_free_ex flag: a pointer outside every address range of the pool is not
//! an error of this pool (NF_ERR_FOREIGN, no message, not counted as an
//! invalid free): for callers holding one pool per device that do not know
//! which one owns a pointer. A pointer inside the pool's ranges that is not a
//! live block's start (double free, interior pointer) is still NF_ERR_INVALID.
#define NF_FREE_PROBE 1u

//! nf_free that also reports the freed block's requested size in `*size`
//! (0 on failure; `size` may be NULL), in one pointer lookup: an nf_block_size
//! + nf_free pair looks the pointer up twice. `flags`: 0 or NF_FREE_PROBE.
NF_API nf_status_t nf_free_ex(nf_pool_t *pool, void *ptr, size_t *size, unsigned flags);

//! Mark a live block as used on `stream` as well: when freed, it is reused only
//! after the work queued on `stream` up to the free has completed.
NF_API nf_status_t nf_record_stream(nf_pool_t *pool, void *ptr, nf_stream_t stream);

//! 1 if the pool knows `stream` (it may record events on it: keep it alive),
//! 0 if it never saw it or has forgotten it (see nf_stream_t), -1 for a NULL pool.
NF_API int nf_stream_known(nf_pool_t *pool, nf_stream_t stream);

//! Size the live block starting at `ptr` was requested with (0 if none: an
//! interior pointer too).
NF_API size_t nf_block_size(nf_pool_t *pool, const void *ptr);

//! Unmap every cached granule and return unmapped granules to the backend
//! (like torch.cuda.empty_cache). Waits for pending stream work first.
NF_API nf_status_t nf_trim(nf_pool_t *pool);

//! Create granules up front so that `bytes` of physical memory exist.
NF_API nf_status_t nf_reserve(nf_pool_t *pool, uint64_t bytes);

//! Change the limit; lowering it below physical releases unused granules.
NF_API nf_status_t nf_set_limit(nf_pool_t *pool, uint64_t limit);

//! The pool's configuration as it is in force (limit resolved, granule known).
NF_API void nf_pool_config(nf_pool_t *pool, nf_config_t *cfg);

//! Replace the pool's clock (default CLOCK_MONOTONIC), which times the release
//! policy (release_idle_ms): `now_ns(ctx)` returns nanoseconds, never
//! decreasing; it is called under the pool's lock and must not call into
//! nofrag. For simulations (`nofrag replay` runs on the trace's time) and
//! tests. NULL restores the default.
NF_API void nf_pool_set_clock(nf_pool_t *pool, uint64_t (*now_ns)(void *ctx), void *ctx);

//! Let device `device` read and write this pool's memory too (several GPUs in
//! one process; torch.cuda's enablePeerAccess): what is mapped now and all
//! that is mapped later. Idempotent; the pool's own device is a no-op.
//! NF_ERR_UNSUPPORTED when the backend has no peers (the host backend) or the
//! driver reports no P2P path (copy with cudaMemcpyPeer instead).
NF_API nf_status_t nf_pool_add_peer(nf_pool_t *pool, int device);

//! Counts of backend calls, one field per call kind.
typedef struct nf_calls_s {
  uint64_t va_reserve, va_release, create, release, map, unmap, set_access;
  uint64_t event_create, event_record, event_query, event_sync, stream_wait;
  uint64_t copy; //!< copies enqueued by nf_offload / nf_prefetch
} nf_calls_t;

//! Pool statistics. Bytes unless noted. `cached` = mapped bytes not holding
//! live data (mapped - live_rounded). `fragmentation` = 1 - live/mapped (live bytes
//! unmapped by a disk or detached offload left out).
typedef struct nf_stats_s {
  uint64_t live, live_peak;                 //!< requested bytes of live blocks
  uint64_t live_rounded, live_rounded_peak; //!< the same, rounded to 512 B
  uint64_t mapped, mapped_peak;             //!< mapped granules x G
  uint64_t physical, physical_peak;         //!< created granules x G
  uint64_t limit, granule;
  uint64_t cached;                          //!< mapped (plus disk / detached-offloaded blocks' granules) - live_rounded, >= 0
  uint64_t live_blocks;
  uint64_t largest_free_mapped;             //!< largest free run that is fully mapped (walk; O(blocks))
  uint64_t live_granules;                   //!< granules overlapped by live blocks (walk)
  uint64_t allocs, frees, invalid_frees, ooms;
  uint64_t reclaims;                        //!< times stitching unmapped cached granules
  uint64_t reclaimed_granules;
  uint64_t cross_stream_reuses;
  nf_calls_t calls;                         //!< backend calls made by this pool
  uint64_t backend_calls;                   //!< sum of calls
  double fragmentation;
  // Host tier (spill and offload). `mapped` above counts granules of both
  // tiers; `physical` counts device granules only.
  uint64_t spilled, spilled_peak;           //!< host granules x G mapped by spill, not under an offloaded live
                                            //!< block (a freed offloaded block's count here until swept)
  uint64_t offloaded;                       //!< host granules x G holding nf_offload'ed blocks
  uint64_t offloaded_disk;                  //!< bytes of blocks offloaded to disk
  uint64_t host_physical, host_physical_peak; //!< host granules created x G
  uint64_t spills;                          //!< allocations that took host granules
  uint64_t offloads, prefetches;            //!< completed nf_offload / nf_prefetch calls that moved data
  // Views (docs/design.md, "Views: stitch once"): a granule stays mapped at
  // places it served before, so that serving them again costs no call.
  uint64_t views;                           //!< parked views now (extra mappings of granules, no data)
  uint64_t view_reuses;                     //!< granules taken back by a parked view (no map call; at most a GPU-side event wait)
  uint64_t view_moves;                      //!< cached granules mapped at a new place instead of unmapped first
  uint64_t view_evictions;                  //!< parked views unmapped
  // Units (config `units`): multi-granule physical allocations made by growth.
  uint64_t units;                           //!< units mapped now
  uint64_t units_made;                      //!< units created
  uint64_t units_unmapped;                  //!< units unmapped (and released)
  uint64_t unit_splits;                     //!< ... of which because a block was placed over part of one
  // Cumulative device memory, for PyTorch's reserved_bytes / segment
  // "allocated" and "freed": physical == physical_created - physical_released.
  uint64_t physical_created;                //!< device granules ever created x G (a unit: its granules)
  uint64_t physical_released;               //!< device granules ever released x G
  // Edge sharing (config `edges`): a live block's end granule that another block holds part of, mapped twice.
  uint64_t edges;                           //!< such granules now (each one fewer granule in use)
  uint64_t edges_made;                      //!< ... made so far
  // Time in backend calls (wall clock on the calling thread, under the pool's
  // lock), per kind as `calls`: what the driver charged, and in event_sync
  // the host waits for stream work (a GPU's queued kernels included).
  nf_calls_t call_ns;                       //!< nanoseconds per kind (0 where no call was made)
  uint64_t backend_ns;                      //!< sum of call_ns
} nf_stats_t;

// ---------------------------------------------------------------- offload

//! Move a live block's memory to `tier` (NF_TIER_HOST, NF_TIER_HOST_DETACHED
//! or NF_TIER_DISK) at the same address, freeing its device granules. `ptr` is the block's start.
//! Only granules that lie wholly inside the block move; the (at most two)
//! edge granules it shares with neighbours stay on the device, so a block
//! smaller than a granule does not move at all (NF_OK). Host tier: spilled
//! granules are on the host already; a block whose owned granules are all
//! spilled does not move either and stays a spilled block (NF_OK).
//!
//! Rules (the caller's side of the contract):
//! - The copy is ordered on `stream` after the work already queued there (and
//!   after work queued on the block's allocation and record_stream streams).
//! - From nf_offload until nf_prefetch returns, the block must not be read or
//!   written by any stream. Host tier: the device granules go back to the
//!   pool once the copy completes (noticed at later pool calls;
//!   nf_offload_wait forces it). Exception, host tier only: after
//!   nf_offload_wait the block may be used in place (the GPU reads and writes
//!   host memory over the bus, slower) as long as that work has completed
//!   before nf_prefetch is called. Detached host tier: asynchronous like the
//!   host tier, but once the copy completed the range is unmapped (touching
//!   it faults, as for disk); each 2 MiB moved costs one unmap out and one
//!   map + set-access back, instead of remapping host memory at the block
//!   (several times cheaper: use it when the block is not needed in place,
//!   e.g. saved activations). Disk tier: synchronous (the host waits for
//!   the copy, writes the file, unmaps); touching the block before
//!   nf_prefetch is an illegal-address fault (CUDA) or SIGSEGV (host backend).
//! - nf_free of an offloaded block is allowed and releases everything.
//! Offloading an already offloaded block to the same tier is a no-op; to
//! another tier, NF_ERR_INVALID. Not enough host memory (spill_limit) or a
//! failing backend: an error, and the block stays where it was, intact.
//! Host and detached tiers: the offload is finished (host memory mapped at
//! the block, or the range unmapped) by whichever later pool call finds the
//! copy complete, maybe a call about another block. If that finish fails,
//! the block stays intact and usable (on the device, or offloaded in part:
//! nf_block_tiers) and the failure, naming the block, is returned by the
//! next nf_offload_wait, not by that call, which does its own work. Only a
//! failed event query or wait (a failing backend) is returned by the call
//! that polls.
//! While a stream is being captured (nf_private_begin), nf_offload,
//! nf_prefetch and nf_offload_wait fail with NF_ERR_INVALID and change
//! nothing: they make event calls and copies, which a capture forbids.
//! A block exported with nf_ipc_export (CUDA IPC) stays on the device until it
//! is freed: another process maps its memory (NF_ERR_INVALID, nothing changes).
NF_API nf_status_t nf_offload(nf_pool_t *pool, void *ptr, nf_stream_t stream, nf_tier_t tier);

//! Bring an offloaded block back to device memory at the same address; the
//! copy is ordered on `stream`: work queued on `stream` afterwards sees the
//! contents, other streams must wait on `stream` first. Device memory is
//! found as for nf_alloc (stitching; spill is not used). NF_ERR_OOM leaves the
//! block offloaded and intact. A block whose offload copy has not completed yet
//! never left the device: the copy is dropped without a host wait (its stream
//! then counts as a record_stream stream of the block, and `stream` waits on
//! it on the GPU, so that work queued on `stream` sees the data). A block that is not
//! offloaded but has spilled granules: those wholly inside it move to the device
//! (the host waits for the block's streams first, since such a block may be in
//! use); a spilled edge granule, which may hold a neighbour's bytes too, stays
//! on the host (nf_block_tiers counts it there); else NF_OK, no-op. A copy back queued on a stream other than the block's own counts as
//! a record_stream stream of the block: freeing it on its own stream does not
//! let its memory be reused or unmapped before the copy has landed.
//! A failing backend: an error, and the block stays offloaded, intact (where
//! host memory cannot be mapped back at the block, its bytes are copied into
//! the device memory mapped there instead: that part is then on the device).
//! Only if even that fails are bytes lost, and then the message says so:
//! "... N B of the block's data are LOST (from ADDR)", naming the block.
NF_API nf_status_t nf_prefetch(nf_pool_t *pool, void *ptr, nf_stream_t stream);

//! Wait for every copy that nf_offload / nf_prefetch enqueued and finish the
//! remapping they wait for (device granules of offloaded blocks return to the
//! pool). Blocks the host. Returns, once, the first offload whose finish
//! failed since the last nf_offload_wait reported one, here or at an earlier
//! pool call (see nf_offload): its message names the block and counts the
//! failures after it; the blocks stay intact and usable.
NF_API nf_status_t nf_offload_wait(nf_pool_t *pool);

//! Where a live block's bytes are: bytes[NF_TIER_DEVICE], bytes[NF_TIER_HOST],
//! bytes[NF_TIER_DISK], by where each granule is (an edge granule shared with a
//! neighbour counts where it is: device, or host if it was spilled; offloaded
//! and spilled granules count as host, detached host bytes too). nf_prefetch
//! brings back all but spilled edge granules.
//! NF_ERR_INVALID if `ptr` is not a live block.
NF_API nf_status_t nf_block_tiers(nf_pool_t *pool, const void *ptr, uint64_t bytes[3]);

//! Fill `st` (includes a walk for largest_free_mapped / live_granules).
//! nf_stats_t grows at its end between 0.x releases (no ABI promise before
//! 1.0): build against the header of the library you load (the Python
//! package checks its mirror against nf_stats_size()).
NF_API void nf_stats_get(nf_pool_t *pool, nf_stats_t *st);
//! Reset the peaks to the current values.
NF_API void nf_stats_reset_peaks(nf_pool_t *pool);

//! Status and message of the last failing call on this thread.
NF_API nf_status_t nf_last_status(void);
NF_API const char *nf_last_error(void);
//! Human-readable name of a status ("NF_ERR_OOM").
NF_API const char *nf_status_str(nf_status_t st);
//! Human-readable bytes into buf ("1.500 GiB", "3.000 MiB", "512 B"): the
//! formatter of nofrag's own messages, for code that prints next to them.
NF_API void nf_format_bytes(char *buf, size_t n, uint64_t bytes);

//! Walk every internal invariant (blocks tile address ranges, no overlap,
//! mapping covers live blocks, counters match). Returns NF_OK or
//! NF_ERR_INVALID with a message. O(blocks + granules); for tests.
NF_API nf_status_t nf_pool_check(nf_pool_t *pool);

// ---------------------------------------------------------------- introspection

//! The pool's whole state as a JSON document, taken under the pool lock in
//! O(blocks + granules): "device" (the pool's device index, configuration
//! key device), "totals" (the nf_stats_t byte fields, spilled and
//! offloaded included; live blocks moved by nf_offload carry "offloaded":
//! "host", "host_detached" or "disk", the names nofrag.Pool.offload takes), "granules"
//! (physical granules by state and tier), "streams" (handles; bit i of a
//! stream mask is streams[i]) and "chunks", each with its "blocks" in address
//! order (addresses as "0x..." strings; live and pending blocks carry their
//! requested size and stream, free and pending ones a stream mask) and its
//! "mapped" granule runs (first address, count, tier, physical granule
//! indices). Returns a malloc'd string to release with nf_snapshot_free, or
//! NULL with nf_last_error() set (NULL pool, out of host memory).
NF_API char *nf_snapshot(nf_pool_t *pool);
NF_API void nf_snapshot_free(char *snapshot);

//! The multi-line report of the last NF_ERR_OOM from nf_alloc on this thread
//! ("" if none): request, limit, live/mapped/physical, largest free ranges, the
//! largest live blocks, what reclaim did, and one suggestion. The first OOM of
//! a pool's burst (OOMs less than a second apart) also prints it to stderr,
//! unless the environment sets NOFRAG_QUIET_OOM=1. Valid until this thread's
//! next OOM.
NF_API const char *nf_last_oom_report(void);

// ---- private pools (private_pool.c)
//! Private pools: memory owned by a CUDA graph or a PyTorch MemPool. Each has
//! a caller-chosen id (nonzero; 0 is the general pool) and a use count.
//! Guarantees, while its use count is above zero:
//! - an allocation routed to it (nf_alloc_private, or a route below) is
//!   served from its own address ranges, and its freed blocks are reused only
//!   by allocations routed to it (a graph's freed temporaries are never handed
//!   to tensors outside the graph that replays into them);
//! - its granules are never unmapped, stitched away or released (nf_trim,
//!   the release policy and stitching skip it); only nf_private_trim does.
//! When the last user releases it, its free memory joins the general pool
//! (ordered after the work of every stream the pool has seen: work that may
//! still target it on other streams, e.g. a graph replay, must be finished
//! first) and its live blocks stay valid, freed later as usual.
//! Routes: nf_private_begin routes allocations on `stream` (which the caller
//! is about to capture) and nf_private_begin_thread those of the calling
//! thread, until nf_private_end(id). Routes nest: the newest matching one
//! wins (innermost capture first); several captures may be under way at once.
//! While a stream route exists the pool makes no event call (record, query,
//! synchronize, wait) and never waits on the host: blocks freed on another
//! stream are reused only when already known safe, record_stream records are
//! deferred, and nf_trim / nf_private_trim fail with NF_ERR_INVALID.
//!
//! Create (use count 1) or add a user.
NF_API nf_status_t nf_private_incref(nf_pool_t *pool, uint64_t id);
//! Drop a user; at zero the pool is handed back (above) and its routes end.
NF_API nf_status_t nf_private_release(nf_pool_t *pool, uint64_t id);
//! Use count (0: no such pool).
NF_API uint64_t nf_private_use_count(nf_pool_t *pool, uint64_t id);
//! Route allocations on `stream` to private pool `id` and treat the stream
//! as being captured (no event calls on it, see above).
NF_API nf_status_t nf_private_begin(nf_pool_t *pool, uint64_t id, nf_stream_t stream);
//! Route allocations made by the calling thread to private pool `id`.
NF_API nf_status_t nf_private_begin_thread(nf_pool_t *pool, uint64_t id);
//! End every route to private pool `id` (NF_ERR_INVALID if there was none).
NF_API nf_status_t nf_private_end(nf_pool_t *pool, uint64_t id);
//! nf_alloc served from private pool `id` whatever the routes say.
NF_API void *nf_alloc_private(nf_pool_t *pool, uint64_t id, size_t size, nf_stream_t stream);
//! Allocate exactly at `addr` (a free range of private pool `id`, 0: the
//! general pool): restoring a checkpointed pool state (PyTorch's CUDA-graph
//! trees). NF_ERR_INVALID if the range is not free there.
NF_API void *nf_alloc_at(nf_pool_t *pool, uint64_t id, void *addr, size_t size, nf_stream_t stream);
//! Unmap the pool's free granules (waits for the streams) and release unused
//! granules down to `retain`: emptying a MemPool's cache. Not during a capture.
NF_API nf_status_t nf_private_trim(nf_pool_t *pool, uint64_t id);
//! Live blocks of private pool `id`: up to n addresses in out; returns how many there are.
NF_API size_t nf_private_live(nf_pool_t *pool, uint64_t id, void **out, size_t n);
//! Private pool holding live block `ptr` (0: general pool, or not a live block).
NF_API uint64_t nf_private_of(nf_pool_t *pool, const void *ptr);
//! 1 while some stream route (capture) exists.
NF_API int nf_capturing(nf_pool_t *pool);
// ---- end private pools

#ifdef __cplusplus
}
#endif
#endif

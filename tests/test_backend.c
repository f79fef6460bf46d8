// Host backend tests: it must behave like the CUDA driver VMM API (validation,
// data persistence across remaps, deferred release, threads, a fork()ed
// child). Its events and stream-order checks are tested in test_host_event.c,
// the kernel's bound on mappings in test_host_maps.c, the fault wrapper in
// test_fault_backend.c.
#include "backend_test.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

static int all_zero(uintptr_t va, size_t size) {
  const uint64_t *p = (const uint64_t *)va;
  for (size_t i = 0; i < size / 8; i++)
    if (p[i]) return 0;
  return 1;
}

// Whether `p` is accessible, from the kernel's own view (/proc/self/maps):
// a write to an address that is not would fault, as on CUDA. (Reading the
// maps rather than faulting in a child keeps sanitizers and valgrind quiet.)
static int accessible(uintptr_t p) {
  FILE *f = fopen("/proc/self/maps", "r");
  assert_non_null(f);
  char line[512];
  int rw = -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perm[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perm) == 3 && p >= lo && p < hi) {
      rw = perm[0] == 'r' && perm[1] == 'w';
      break;
    }
  }
  fclose(f);
  assert_true(rw >= 0); // the address must be reserved at least
  return rw;
}

static int open_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

// ---------------------------------------------------------------- host backend

static void test_host_create_validation(void **state) {
  (void)state;
  nf_backend_t *be = (nf_backend_t *)&be;
  long page = sysconf(_SC_PAGESIZE);
  assert_int_equal(nf_backend_host_create(&be, NF_GiB, 3 * (uint64_t)page), NF_ERR_INVALID);
  assert_null(be);
  assert_non_null(strstr(nf_last_error(), "granule")); // no backend to carry the message
  assert_int_equal(nf_backend_host_create(&be, NF_GiB, (uint64_t)page / 2), NF_ERR_INVALID);
  assert_int_equal(nf_backend_host_create(&be, NF_GiB, 0), NF_ERR_INVALID);
  assert_int_equal(nf_backend_host_create(&be, 0, G), NF_ERR_INVALID);
  assert_int_equal(nf_backend_host_create(&be, G - 1, G), NF_ERR_INVALID);
  assert_int_equal(nf_backend_host_create(NULL, NF_GiB, G), NF_ERR_INVALID);

  be = nft_host(10 * G + 123, G);
  assert_string_equal(be->ops->name, "host");
  size_t g = 0;
  assert_int_equal(be->ops->granularity(be, NF_TIER_DEVICE, &g), NF_OK);
  assert_int_equal(g, G);
  assert_int_equal(be->ops->granularity(be, NF_TIER_HOST, &g), NF_OK);
  assert_int_equal(be->ops->granularity(be, NF_TIER_DISK, &g), NF_ERR_UNSUPPORTED);
  assert_int_equal(be->ops->granularity(be, (nf_tier_t)7, &g), NF_ERR_INVALID);
  nft_err_has(be, "unknown tier");
  uint64_t total = 0, free_bytes = 0;
  assert_int_equal(be->ops->capacity(be, NF_TIER_DEVICE, &total, &free_bytes), NF_OK);
  assert_int_equal(total, 10 * G + 123);
  assert_int_equal(free_bytes, 10 * G + 123);
  nf_handle_t h;
  assert_int_equal(be->ops->mem_create(be, NF_TIER_DISK, G, &h), NF_ERR_UNSUPPORTED);
  assert_int_equal(be->ops->mem_create(be, NF_TIER_DEVICE, 0, &h), NF_ERR_INVALID);
  assert_int_equal(be->ops->mem_create(be, NF_TIER_DEVICE, G + 1, &h), NF_ERR_INVALID);
  nft_err_has(be, "multiple of granule");
  nft_usage_is(be, 0, 0);
  nf_backend_destroy(be);
  nf_backend_destroy(NULL);
}

static void test_host_remap_keeps_data(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(16 * G, G);
  uintptr_t a = reserve(be, 4 * G), b = reserve(be, 4 * G);
  nf_handle_t h = create(be, G);
  map_rw(be, a + G, G, h);
  nft_fill((void *)(a + G), G, 42);
  assert_int_equal(be->ops->unmap(be, a + G, G), NF_OK);
  map_rw(be, b + 2 * G, G, h);
  assert_true(nft_check((void *)(b + 2 * G), G, 42));
  // One handle mapped twice: both addresses show the same memory.
  map_rw(be, a, G, h);
  nft_usage_is(be, 1, 2);
  ((volatile char *)a)[100] = 7;
  assert_int_equal(((volatile char *)(b + 2 * G))[100], 7);
  assert_int_equal(be->ops->unmap(be, a, G), NF_OK);
  assert_int_equal(be->ops->unmap(be, b + 2 * G, G), NF_OK);
  assert_int_equal(be->ops->mem_release(be, h), NF_OK);
  assert_int_equal(be->ops->va_release(be, a, 4 * G), NF_OK);
  assert_int_equal(be->ops->va_release(be, b, 4 * G), NF_OK);
  nft_usage_is(be, 0, 0);
  nf_backend_destroy(be);
}

static void test_host_access_faults(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(4 * G, G);
  uintptr_t a = reserve(be, 2 * G);
  nf_handle_t h = create(be, G);
  assert_false(accessible(a)); // reserved only
  assert_int_equal(be->ops->map(be, a, G, h), NF_OK);
  assert_false(accessible(a)); // mapped, no set_access: faults as on CUDA
  assert_int_equal(be->ops->set_access(be, a, G), NF_OK);
  assert_true(accessible(a));
  assert_int_equal(be->ops->set_access(be, a, 2 * G), NF_ERR_INVALID); // second granule unmapped
  nft_err_has(be, "not mapped");
  assert_int_equal(be->ops->unmap(be, a, G), NF_OK);
  assert_false(accessible(a)); // unmapped again
  assert_int_equal(be->ops->map(be, a + G, G, h), NF_OK);
  assert_false(accessible(a + G)); // a new mapping starts without access
  nf_backend_destroy(be);           // leaks on purpose: destroy cleans up
}

static void test_host_release_zeroes(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(G, G); // one slot: every create reuses it
  uintptr_t a = reserve(be, 2 * G);
  nf_handle_t h = create(be, G);
  map_rw(be, a, G, h);
  memset((void *)a, 0xAB, G);
  assert_int_equal(be->ops->unmap(be, a, G), NF_OK);
  assert_int_equal(be->ops->mem_release(be, h), NF_OK);
  assert_int_equal(be->ops->mem_release(be, h), NF_ERR_INVALID); // double release
  nf_handle_t h2 = create(be, G);
  assert_true(h2 != h);                                  // stale handles stay invalid
  assert_int_equal(be->ops->map(be, a, G, h), NF_ERR_INVALID);
  map_rw(be, a + G, G, h2);
  assert_true(all_zero(a + G, G));

  // Release while mapped: deferred until the last unmap, as on CUDA.
  memset((void *)(a + G), 0xCD, G);
  assert_int_equal(be->ops->mem_release(be, h2), NF_OK);
  nft_usage_is(be, 0, 1);
  assert_int_equal(((volatile unsigned char *)(a + G))[5], 0xCD); // still readable
  uint64_t total, free_bytes;
  assert_int_equal(be->ops->capacity(be, NF_TIER_DEVICE, &total, &free_bytes), NF_OK);
  assert_int_equal(free_bytes, 0); // the memory is still held
  nf_handle_t h3;
  assert_int_equal(be->ops->mem_create(be, NF_TIER_DEVICE, G, &h3), NF_ERR_OOM);
  assert_int_equal(be->ops->mem_release(be, h2), NF_ERR_INVALID);
  assert_int_equal(be->ops->map(be, a, G, h2), NF_ERR_INVALID);
  assert_int_equal(be->ops->unmap(be, a + G, G), NF_OK);
  nft_usage_is(be, 0, 0);
  assert_int_equal(be->ops->capacity(be, NF_TIER_DEVICE, &total, &free_bytes), NF_OK);
  assert_int_equal(free_bytes, G);
  h3 = create(be, G);
  map_rw(be, a, G, h3);
  assert_true(all_zero(a, G));
  assert_int_equal(be->ops->unmap(be, a, G), NF_OK);
  assert_int_equal(be->ops->mem_release(be, h3), NF_OK);
  assert_int_equal(be->ops->va_release(be, a, 2 * G), NF_OK);
  nf_backend_destroy(be);
}

static void test_host_map_errors(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(8 * G, G);
  uintptr_t a = reserve(be, 4 * G);
  nf_handle_t h1 = create(be, G), h2 = create(be, G), h3 = create(be, 2 * G);
  map_rw(be, a, G, h1);
  nft_fill((void *)a, G, 1);
  nft_usage_is(be, 4, 1);
  assert_int_equal(be->ops->map(be, a + 1, G, h2), NF_ERR_INVALID); // unaligned
  nft_err_has(be, "aligned");
  assert_int_equal(be->ops->map(be, a, G, h2), NF_ERR_INVALID); // double map
  nft_err_has(be, "already mapped");
  assert_int_equal(be->ops->map(be, a + G, 2 * G, h2), NF_ERR_INVALID); // size != handle size
  assert_int_equal(be->ops->map(be, a + 4 * G, G, h2), NF_ERR_INVALID); // just past the range
  nft_err_has(be, "reserved range");
  assert_int_equal(be->ops->map(be, a - G, G, h2), NF_ERR_INVALID);     // just before
  assert_int_equal(be->ops->map(be, a + 3 * G, 2 * G, h3), NF_ERR_INVALID); // straddles the end
  assert_int_equal(be->ops->map(be, a + G, G, 0), NF_ERR_INVALID);
  assert_int_equal(be->ops->map(be, a + G, G, h2 ^ ((uint64_t)1 << 32)), NF_ERR_INVALID); // wrong generation
  assert_int_equal(be->ops->map(be, a + G, G, 12345), NF_ERR_INVALID);
  nft_usage_is(be, 4, 1);
  assert_true(nft_check((void *)a, G, 1));

  assert_int_equal(be->ops->unmap(be, a, 2 * G), NF_ERR_INVALID); // a+G is not mapped
  assert_int_equal(be->ops->unmap(be, a + 1, G), NF_ERR_INVALID);
  assert_int_equal(be->ops->unmap(be, a, 0), NF_ERR_INVALID);
  assert_int_equal(be->ops->unmap(be, a + G, G), NF_ERR_INVALID);
  assert_int_equal(be->ops->unmap(be, (uintptr_t)G, G), NF_ERR_INVALID);
  assert_int_equal(be->ops->set_access(be, a + G, G), NF_ERR_INVALID);
  nft_usage_is(be, 4, 1);
  assert_true(nft_check((void *)a, G, 1));

  // A two-granule handle cannot be unmapped in part.
  map_rw(be, a + 2 * G, 2 * G, h3);
  nft_fill((void *)(a + 2 * G), 2 * G, 3);
  assert_int_equal(be->ops->unmap(be, a + 2 * G, G), NF_ERR_INVALID);
  nft_err_has(be, "cut");
  assert_int_equal(be->ops->unmap(be, a + 3 * G, G), NF_ERR_INVALID);
  assert_int_equal(be->ops->unmap(be, a, 4 * G), NF_ERR_INVALID); // a+G unmapped
  nft_usage_is(be, 4, 3);
  assert_true(nft_check((void *)(a + 2 * G), 2 * G, 3));
  // One unmap may cover several whole mappings.
  map_rw(be, a + G, G, h2);
  assert_int_equal(be->ops->unmap(be, a, 4 * G), NF_OK);
  nft_usage_is(be, 4, 0);
  assert_int_equal(be->ops->mem_release(be, h1), NF_OK);
  assert_int_equal(be->ops->mem_release(be, h2), NF_OK);
  assert_int_equal(be->ops->mem_release(be, h3), NF_OK);
  assert_int_equal(be->ops->va_release(be, a, 4 * G), NF_OK);
  nft_usage_is(be, 0, 0);
  nf_backend_destroy(be);
}

static void test_host_va(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(4 * G, G);
  uintptr_t a;
  assert_int_equal(be->ops->va_reserve(be, 0, 0, &a), NF_ERR_INVALID);
  assert_int_equal(be->ops->va_reserve(be, G + 1, 0, &a), NF_ERR_INVALID);
  assert_int_equal(be->ops->va_reserve(be, G, 3 * G, &a), NF_ERR_INVALID);
  assert_int_equal(be->ops->va_reserve(be, 4 * G, 64 * G, &a), NF_OK);
  assert_int_equal(a % (64 * G), 0);
  nf_handle_t h = create(be, G);
  assert_int_equal(be->ops->map(be, a + 3 * G, G, h), NF_OK);
  assert_int_equal(be->ops->va_release(be, a, 4 * G), NF_ERR_INVALID); // still mapped
  nft_err_has(be, "still mapped");
  assert_int_equal(be->ops->va_release(be, a, 2 * G), NF_ERR_INVALID); // wrong size
  assert_int_equal(be->ops->va_release(be, a + G, 3 * G), NF_ERR_INVALID);
  assert_int_equal(be->ops->unmap(be, a + 3 * G, G), NF_OK);
  assert_int_equal(be->ops->va_release(be, a, 4 * G), NF_OK);
  assert_int_equal(be->ops->va_release(be, a, 4 * G), NF_ERR_INVALID); // twice
  assert_int_equal(be->ops->map(be, a, G, h), NF_ERR_INVALID);          // range is gone
  assert_int_equal(be->ops->mem_release(be, h), NF_OK);
  nf_backend_destroy(be);
}

static void test_host_capacity_and_tiers(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(4 * G, G);
  nf_handle_t d[4], x, hs[4];
  for (int i = 0; i < 4; i++) d[i] = create(be, G);
  assert_int_equal(be->ops->mem_create(be, NF_TIER_DEVICE, G, &x), NF_ERR_OOM);
  nft_err_has(be, "out of memory");
  for (int i = 0; i < 4; i++) assert_int_equal(be->ops->mem_create(be, NF_TIER_HOST, G, &hs[i]), NF_OK);
  assert_int_equal(be->ops->mem_create(be, NF_TIER_HOST, G, &x), NF_ERR_OOM);
  uint64_t total, free_bytes;
  assert_int_equal(be->ops->capacity(be, NF_TIER_HOST, &total, &free_bytes), NF_OK);
  assert_int_equal(free_bytes, 0);
  nft_usage_is(be, 8, 0);
  // Host-tier memory maps and keeps data like device memory.
  uintptr_t a = reserve(be, G);
  map_rw(be, a, G, hs[2]);
  nft_fill((void *)a, G, 9);
  assert_int_equal(be->ops->unmap(be, a, G), NF_OK);
  map_rw(be, a, G, hs[2]);
  assert_true(nft_check((void *)a, G, 9));
  assert_int_equal(be->ops->unmap(be, a, G), NF_OK);
  // Fragmented: 2 granules free but not contiguous.
  assert_int_equal(be->ops->mem_release(be, d[1]), NF_OK);
  assert_int_equal(be->ops->mem_release(be, d[3]), NF_OK);
  assert_int_equal(be->ops->mem_create(be, NF_TIER_DEVICE, 2 * G, &x), NF_ERR_OOM);
  assert_int_equal(be->ops->mem_release(be, d[2]), NF_OK); // coalesces d1..d3
  x = create(be, 3 * G);
  assert_int_equal(be->ops->capacity(be, NF_TIER_DEVICE, &total, &free_bytes), NF_OK);
  assert_int_equal(free_bytes, 0);
  assert_int_equal(be->ops->mem_release(be, x), NF_OK);
  assert_int_equal(be->ops->mem_release(be, d[0]), NF_OK);
  for (int i = 0; i < 4; i++) assert_int_equal(be->ops->mem_release(be, hs[i]), NF_OK);
  nft_usage_is(be, 0, 0);
  nf_backend_destroy(be);
}

// 1 TiB on a machine with far less: memory that is never touched costs nothing.
static void test_host_huge_capacity(void **state) {
  (void)state;
  const uint64_t cap = 1024 * NF_GiB, g = 2 * NF_MiB;
  nf_backend_t *be = nft_host(cap, g);
  enum { N = 64 };
  nf_handle_t h[N];
  for (int i = 0; i < N; i++) assert_int_equal(be->ops->mem_create(be, NF_TIER_DEVICE, g, &h[i]), NF_OK);
  uint64_t total, free_bytes;
  assert_int_equal(be->ops->capacity(be, NF_TIER_DEVICE, &total, &free_bytes), NF_OK);
  assert_int_equal(total, cap);
  assert_int_equal(free_bytes, cap - N * g);
  uintptr_t a = 0;
  assert_int_equal(be->ops->va_reserve(be, 4 * g, 0, &a), NF_OK);
  assert_int_equal(a % g, 0);
  map_rw(be, a + g, g, h[N - 1]);
  ((volatile char *)(a + g))[g - 1] = 5;
  assert_int_equal(((volatile char *)(a + g))[g - 1], 5);
  assert_int_equal(be->ops->unmap(be, a + g, g), NF_OK);
  for (int i = 0; i < N; i++) assert_int_equal(be->ops->mem_release(be, h[i]), NF_OK);
  assert_int_equal(be->ops->va_release(be, a, 4 * g), NF_OK);
  nf_backend_destroy(be);
}

static void test_host_usage(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(8 * G, G);
  uint64_t g = 1, m = 1;
  nf_backend_host_usage(NULL, &g, &m); // not a host backend: zeros
  assert_int_equal(g + m, 0);
  uintptr_t a = reserve(be, 8 * G);
  nf_handle_t h1 = create(be, G), h2 = create(be, 2 * G), h3 = create(be, G);
  nft_usage_is(be, 4, 0);
  assert_int_equal(be->ops->map(be, a, G, h1), NF_OK);
  assert_int_equal(be->ops->map(be, a + G, G, h1), NF_OK);
  assert_int_equal(be->ops->map(be, a + 2 * G, 2 * G, h2), NF_OK);
  nft_usage_is(be, 4, 4);
  assert_int_equal(be->ops->mem_release(be, h2), NF_OK); // deferred
  nft_usage_is(be, 2, 4);
  assert_int_equal(be->ops->unmap(be, a + 2 * G, 2 * G), NF_OK);
  nft_usage_is(be, 2, 2);
  assert_int_equal(be->ops->unmap(be, a, G), NF_OK);
  nft_usage_is(be, 2, 1);
  assert_int_equal(be->ops->mem_release(be, h3), NF_OK);
  nft_usage_is(be, 1, 1);
  nf_backend_host_usage(be, NULL, NULL); // NULL outputs are allowed
  int fds = open_fds();
  nf_backend_destroy(be); // h1 still mapped: destroy frees it all
  assert_true(open_fds() < fds); // the memfd is closed
}

static void test_host_copy(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(4 * G, G);
  uintptr_t a = reserve(be, 4 * G);
  nf_handle_t h1 = create(be, G), h2 = create(be, G), h3 = create(be, G);
  map_rw(be, a, G, h1);
  map_rw(be, a + G, G, h2);
  assert_int_equal(be->ops->map(be, a + 2 * G, G, h3), NF_OK); // no access
  nft_fill((void *)a, G, 11);
  assert_int_equal(be->ops->copy(be, a + G, a, G, NULL), NF_OK);
  assert_true(nft_check((void *)(a + G), G, 11));
  char *buf = malloc(G);
  assert_non_null(buf);
  nft_fill(buf, G, 12);
  assert_int_equal(be->ops->copy(be, a, (uintptr_t)buf, G, (nf_stream_t)0x10), NF_OK); // host memory is fine
  assert_true(nft_check((void *)a, G, 12));
  assert_int_equal(be->ops->copy(be, a + G / 2, a, G, NULL), NF_OK); // spans two mappings
  assert_int_equal(be->ops->copy(be, a + 2 * G, a, 8, NULL), NF_ERR_INVALID);
  assert_int_equal(be->ops->copy(be, (uintptr_t)buf, a + 3 * G, 8, NULL), NF_ERR_INVALID);
  assert_int_equal(be->ops->copy(be, a + G + G / 2, a, G, NULL), NF_ERR_INVALID); // runs into no-access
  assert_int_equal(be->ops->copy(be, a + 2 * G, a + 3 * G, 0, NULL), NF_OK);      // empty copy
  free(buf);
  nf_backend_destroy(be);
}

typedef struct {
  nf_backend_t *be;
  int id;
} thread_arg;
static void *thread_body(void *p) {
  thread_arg *t = p;
  nf_backend_t *be = t->be;
  uintptr_t a;
  if (be->ops->va_reserve(be, 8 * G, 0, &a) != NF_OK) return (void *)1;
  for (int i = 0; i < 200; i++) {
    uintptr_t va = a + (size_t)(i % 8) * G;
    nf_handle_t h;
    nf_event_t ev;
    uint64_t tag = (uint64_t)t->id << 32 | (uint64_t)i;
    if (be->ops->mem_create(be, NF_TIER_DEVICE, G, &h) != NF_OK) return (void *)2;
    if (be->ops->map(be, va, G, h) != NF_OK || be->ops->set_access(be, va, G) != NF_OK) return (void *)3;
    if (!all_zero(va, G)) return (void *)4; // every fresh handle reads zero
    nft_fill((void *)va, G, tag);
    if (be->ops->event_create(be, &ev) != NF_OK || be->ops->event_record(be, ev, (nf_stream_t)va) != NF_OK ||
        be->ops->event_query(be, ev) != NF_OK || be->ops->event_destroy(be, ev) != NF_OK)
      return (void *)5;
    if (!nft_check((void *)va, G, tag)) return (void *)6;
    if (be->ops->unmap(be, va, G) != NF_OK || be->ops->mem_release(be, h) != NF_OK) return (void *)7;
  }
  return be->ops->va_release(be, a, 8 * G) == NF_OK ? NULL : (void *)8;
}

static void test_host_threads(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(16 * G, G);
  enum { T = 4 };
  pthread_t th[T];
  thread_arg args[T];
  for (int i = 0; i < T; i++) {
    args[i] = (thread_arg){be, i};
    assert_int_equal(pthread_create(&th[i], NULL, thread_body, &args[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    void *ret = (void *)1;
    assert_int_equal(pthread_join(th[i], &ret), 0);
    assert_null(ret);
  }
  nft_usage_is(be, 0, 0);
  nf_backend_destroy(be);
}

// A fork()ed child shares the host backend's memfd with its parent: its
// destroy of the inherited pool must not zero the parent's live data, and it
// may not create memory there (the parent could hand out the same extents).
static void test_host_fork_child(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p;
  assert_int_equal(nf_backend_host_create(&be, 1 * NF_GiB, 2 * NF_MiB), NF_OK);
  nf_config_t c;
  nf_config_default(&c);
  c.limit = 64 * NF_MiB;
  assert_int_equal(nf_pool_create(&p, be, &c), NF_OK);
  size_t n = 6 * NF_MiB;
  unsigned char *a = nf_alloc(p, n, NULL);
  assert_non_null(a);
  for (size_t i = 0; i < n; i += 4096) a[i] = (unsigned char)(i / 4096 * 7 + 1);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    nf_handle_t h;
    int code = be->ops->mem_create(be, NF_TIER_DEVICE, 2 * NF_MiB, &h) == NF_ERR_INVALID ? 0 : 3;
    nf_pool_destroy(p); // releases (and used to punch) every granule
    nf_backend_destroy(be);
    _exit(code);
  }
  int ws = 0;
  assert_int_equal(waitpid(child, &ws, 0), child);
  assert_true(WIFEXITED(ws));
  assert_int_equal(WEXITSTATUS(ws), 0);
  size_t bad = 0;
  for (size_t i = 0; i < n; i += 4096) bad += a[i] != (unsigned char)(i / 4096 * 7 + 1);
  assert_int_equal(bad, 0);
  assert_int_equal(nf_free(p, a), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_create_validation),
      cmocka_unit_test(test_host_remap_keeps_data),
      cmocka_unit_test(test_host_access_faults),
      cmocka_unit_test(test_host_release_zeroes),
      cmocka_unit_test(test_host_map_errors),
      cmocka_unit_test(test_host_va),
      cmocka_unit_test(test_host_capacity_and_tiers),
      cmocka_unit_test(test_host_huge_capacity),
      cmocka_unit_test(test_host_usage),
      cmocka_unit_test(test_host_copy),
      cmocka_unit_test(test_host_threads),
      cmocka_unit_test(test_host_fork_child),
  };
  return cmocka_run_group_tests(tests, setup_granule, NULL);
}

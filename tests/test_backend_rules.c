// Host backend rules beyond test_backend.c (src/backend/host*.c): what each op
// gives back or refuses at its edges, the mapping bound (NOFRAG_HOST_MAX_MAPS,
// vm.max_map_count) met more than once, and the sharing ops' refusals.
#include "nf_test.h"

#include "backend/backend.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// A small granule keeps tests fast; at least a page on any machine.
static size_t G;

static int setup_granule(void **state) {
  (void)state;
  G = nft_small_granule();
  return 0;
}

static nf_handle_t create(nf_backend_t *be, nf_tier_t tier, size_t size) {
  nf_handle_t h = 0;
  assert_int_equal(be->ops->mem_create(be, tier, size, &h), NF_OK);
  return h;
}

// The kernel's bound met by three requests in a row, each rolled back: the
// spare page that unmap gives up at the bound must be made again for the next
// rollback (made only at creation, the second rollback's first unmap would
// fail at the bound, leaving mapped a granule the pool means to reuse).
static void test_host_unmap_at_map_bound_repeated(void **state) {
  (void)state;
  enum { N = 64 };
  nf_backend_t *be = nft_host(N * G, G);
  uintptr_t va = 0;
  assert_int_equal(be->ops->va_reserve(be, N * G, 0, &va), NF_OK);
  nf_handle_t h[N];
  for (int i = 0; i < N; i++) h[i] = create(be, NF_TIER_DEVICE, G);
  if (!nft_fill_maps_to(N / 2)) {
    nf_backend_destroy(be);
    print_message("skipping: vm.max_map_count unknown or too large to reach, or under TSan\n");
    skip();
  }
  for (int round = 0; round < 3; round++) {
    int m = 0;
    nf_status_t st = NF_OK;
    while (m < N && (st = be->ops->map(be, va + (uintptr_t)m * G, G, h[N - 1 - m])) == NF_OK) m++;
    if (st == NF_OK) fail_msg("round %d: %d maps near vm.max_map_count all succeeded", round, N);
    nft_err_has(be, "out of memory mappings");
    for (int i = 0; i < m; i++) {
      st = be->ops->unmap(be, va + (uintptr_t)i * G, G);
      if (st != NF_OK) fail_msg("round %d: unmap of granule %d of %d at the bound: %s", round, i, m, nf__backend_err());
    }
    nft_usage_is(be, N, 0);
  }
  nft_filler_free();
  for (int i = 0; i < N; i++) assert_int_equal(be->ops->mem_release(be, h[i]), NF_OK);
  assert_int_equal(be->ops->va_release(be, va, N * G), NF_OK);
  nf_backend_destroy(be);
}

// va_reserve over-reserves by the alignment and gives the excess back: the
// page just past a fresh range is not mapped (the excess after the range is
// at least a page whatever address mmap chose, and nothing maps in between).
// Left reserved, it would leak up to the alignment at every reservation.
static void test_host_va_gives_excess_back(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(4 * G, G);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  for (int i = 0; i < 8; i++) {
    size_t align = i % 2 ? 0 : (size_t)G << (4 + i), size = (size_t)(1 + i) * G;
    uintptr_t va = 0;
    assert_int_equal(be->ops->va_reserve(be, size, align, &va), NF_OK);
    if (align) assert_int_equal(va % align, 0);
    errno = 0;
    if (msync((void *)(va + size), page, MS_ASYNC) == 0 || errno != ENOMEM)
      fail_msg("reservation %d (%zu B, alignment %zu): the page after it is still mapped", i, size, align);
    assert_int_equal(msync((void *)(va + size - page), page, MS_ASYNC), 0); // its own last page is
    assert_int_equal(be->ops->va_release(be, va, size), NF_OK);
  }
  nf_backend_destroy(be);
}

// NOFRAG_HOST_MAX_MAPS (the stand-in for vm.max_map_count) allows exactly
// that many maps: the next one fails, names the bound and changes nothing,
// and map_room answers the same for n more, counting what is held.
static void test_host_max_maps_exact(void **state) {
  (void)state;
  setenv("NOFRAG_HOST_MAX_MAPS", "3", 1);
  nf_backend_t *be = nft_host(8 * G, G);
  unsetenv("NOFRAG_HOST_MAX_MAPS");
  uintptr_t va = 0;
  assert_int_equal(be->ops->va_reserve(be, 4 * G, 0, &va), NF_OK);
  nf_handle_t h[4];
  for (int i = 0; i < 4; i++) h[i] = create(be, NF_TIER_DEVICE, G);
  assert_int_equal(be->ops->map_room(be, 3), NF_OK);
  assert_int_equal(be->ops->map_room(be, 4), NF_ERR_BACKEND);
  nft_err_has(be, "map of 4 granules: out of memory mappings");
  nft_err_has(be, "NOFRAG_HOST_MAX_MAPS=3");
  assert_int_equal(be->ops->map(be, va, G, h[0]), NF_OK);
  assert_int_equal(be->ops->map_room(be, 2), NF_OK);
  assert_int_equal(be->ops->map_room(be, 3), NF_ERR_BACKEND);
  assert_int_equal(be->ops->map(be, va + G, G, h[1]), NF_OK);
  assert_int_equal(be->ops->map(be, va + 2 * G, G, h[2]), NF_OK);
  assert_int_equal(be->ops->map_room(be, 0), NF_OK);
  assert_int_equal(be->ops->map_room(be, 1), NF_ERR_BACKEND);
  assert_int_equal(be->ops->map(be, va + 3 * G, G, h[3]), NF_ERR_BACKEND);
  nft_err_has(be, "NOFRAG_HOST_MAX_MAPS=3");
  nft_usage_is(be, 4, 3);
  assert_int_equal(be->ops->unmap(be, va, G), NF_OK);
  assert_int_equal(be->ops->map(be, va + 3 * G, G, h[3]), NF_OK); // room again
  assert_int_equal(be->ops->unmap(be, va + G, 3 * G), NF_OK);
  for (int i = 0; i < 4; i++) assert_int_equal(be->ops->mem_release(be, h[i]), NF_OK);
  assert_int_equal(be->ops->va_release(be, va, 4 * G), NF_OK);
  nf_backend_destroy(be);
}

// A copy whose range wraps around the address space is refused (as on CUDA),
// not carried out from the wrapped-around start.
static void test_host_copy_wraps(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(4 * G, G);
  char buf[64] = {0};
  uintptr_t top = UINTPTR_MAX - 15; // 16 bytes below the end: 32 wrap around
  assert_int_equal(be->ops->copy(be, top, (uintptr_t)buf, 32, NULL), NF_ERR_INVALID);
  nft_err_has(be, "destination wraps around");
  assert_int_equal(be->ops->copy(be, (uintptr_t)buf, top, 32, NULL), NF_ERR_INVALID);
  nft_err_has(be, "source wraps around");
  nf_backend_destroy(be);
}

// The sharing ops' refusals: host-tier memory is not exportable (as on
// CUDA), and an import's extent must lie wholly inside the shared memory:
// one that starts inside and runs past its end would raise SIGBUS when
// touched. What is in bounds maps and shows the exporter's data.
static void test_host_share_bounds(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(4 * G, G);
  nf_handle_t hh = create(be, NF_TIER_HOST, G), hd = create(be, NF_TIER_DEVICE, G);
  int fd = -1;
  uint64_t off = 99;
  assert_int_equal(be->ops->mem_export(be, hh, &fd, &off), NF_ERR_UNSUPPORTED);
  nft_err_has(be, "host memory cannot be shared");
  assert_int_equal(fd, -1);
  assert_int_equal(be->ops->mem_export(be, hd, &fd, &off), NF_OK);
  assert_true(fd >= 0);
  struct stat sb;
  assert_int_equal(fstat(fd, &sb), 0);
  uint64_t end = (uint64_t)sb.st_size; // the device memfd: the capacity
  nf_backend_t *imp = nft_host(4 * G, G);
  nf_handle_t x;
  assert_int_equal(imp->ops->mem_import(imp, fd, end - G, 2 * G, &x), NF_ERR_INVALID); // runs past the end
  nft_err_has(imp, "is not a granule of the shared memory");
  assert_int_equal(imp->ops->mem_import(imp, fd, end, G, &x), NF_ERR_INVALID);         // starts at the end
  assert_int_equal(imp->ops->mem_import(imp, fd, off, G / 2, &x), NF_ERR_INVALID);      // half a granule
  nft_usage_is(imp, 0, 0);
  // In bounds: the exporter's bytes.
  uintptr_t a = 0, b = 0;
  assert_int_equal(be->ops->va_reserve(be, G, 0, &a), NF_OK);
  assert_int_equal(be->ops->map(be, a, G, hd), NF_OK);
  assert_int_equal(be->ops->set_access(be, a, G), NF_OK);
  nft_fill((void *)a, G, 31);
  assert_int_equal(imp->ops->mem_import(imp, fd, off, G, &x), NF_OK);
  assert_int_equal(imp->ops->va_reserve(imp, G, 0, &b), NF_OK);
  assert_int_equal(imp->ops->map(imp, b, G, x), NF_OK);
  assert_int_equal(imp->ops->set_access(imp, b, G), NF_OK);
  assert_true(nft_check((void *)b, G, 31));
  close(fd);
  nf_backend_destroy(imp);
  nf_backend_destroy(be);
}

// One unmap of many mappings whose handles were released while mapped
// (deferred): every extent comes back at once, apart from one another (the
// live handles between them keep them from merging), so the free list must
// grow by all of them in one step (grown too little, it overflows its array:
// an ASan build stops there). Then every byte is free again, in one piece:
// the whole capacity can be created as a single handle.
static void test_host_unmap_many_deferred(void **state) {
  (void)state;
  enum { N = 200 };
  nf_backend_t *be = nft_host(2 * N * G, G);
  uintptr_t va = 0;
  assert_int_equal(be->ops->va_reserve(be, N * G, 0, &va), NF_OK);
  nf_handle_t h[2 * N];
  for (int i = 0; i < 2 * N; i++) h[i] = create(be, NF_TIER_DEVICE, G); // extents in order
  for (int i = 0; i < N; i++) {
    assert_int_equal(be->ops->map(be, va + (uintptr_t)i * G, G, h[2 * i]), NF_OK);
    assert_int_equal(be->ops->mem_release(be, h[2 * i]), NF_OK); // deferred: still mapped
  }
  nft_usage_is(be, N, N);
  assert_int_equal(be->ops->unmap(be, va, N * G), NF_OK); // N extents freed, none adjacent
  nft_usage_is(be, N, 0);
  uint64_t total = 0, free_bytes = 0;
  assert_int_equal(be->ops->capacity(be, NF_TIER_DEVICE, &total, &free_bytes), NF_OK);
  assert_int_equal(free_bytes, (uint64_t)N * G);
  for (int i = 0; i < N; i++) assert_int_equal(be->ops->mem_release(be, h[2 * i + 1]), NF_OK);
  nf_handle_t all = create(be, NF_TIER_DEVICE, 2 * N * G); // needs every extent, merged
  assert_int_equal(be->ops->mem_release(be, all), NF_OK);
  assert_int_equal(be->ops->va_release(be, va, N * G), NF_OK);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_host_unmap_at_map_bound_repeated, nft_teardown_filler),
      cmocka_unit_test(test_host_va_gives_excess_back),
      cmocka_unit_test(test_host_max_maps_exact),
      cmocka_unit_test(test_host_copy_wraps),
      cmocka_unit_test(test_host_share_bounds),
      cmocka_unit_test(test_host_unmap_many_deferred),
  };
  return cmocka_run_group_tests(tests, setup_granule, NULL);
}

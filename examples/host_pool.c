// The smallest nofrag program: a pool on the host backend (no GPU needed),
// one allocation written and freed, the pool's statistics printed.
//
// Built against an installed nofrag (scripts/test-install.sh does both):
//   cc host_pool.c $(pkg-config --cflags --libs nofrag) -o host_pool
//   cmake -S examples -B ex -DCMAKE_PREFIX_PATH=PREFIX && cmake --build ex
// With a prefix outside the linker's search path, run it with
// LD_LIBRARY_PATH=PREFIX/lib.
#include <nofrag.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  nf_pool_t *pool = NULL;
  nf_status_t st = nf_pool_create_from_string(&pool, "backend:host,limit:256MiB");
  if (st != NF_OK) {
    fprintf(stderr, "host_pool: nf_pool_create_from_string: %s: %s\n", nf_status_str(st), nf_last_error());
    return 1;
  }
  size_t size = 3u << 20; // 3 MiB: spans two 2 MiB granules
  unsigned char *p = nf_alloc(pool, size, NULL);
  if (!p) {
    fprintf(stderr, "host_pool: nf_alloc(%zu): %s\n", size, nf_last_error());
    nf_pool_destroy(pool);
    return 1;
  }
  memset(p, 0xab, size); // host backend: the block is ordinary memory
  int ok = p[0] == 0xab && p[size - 1] == 0xab;
  nf_stats_t s;
  nf_stats_get(pool, &s);
  printf("nofrag %s: allocated %zu bytes at %p, live %llu, mapped %llu, limit %llu\n", NF_VERSION, size, (void *)p,
         (unsigned long long)s.live, (unsigned long long)s.mapped, (unsigned long long)s.limit);
  st = nf_free(pool, p);
  if (st != NF_OK || !ok) {
    fprintf(stderr, "host_pool: %s\n", ok ? nf_last_error() : "data read back wrong");
    nf_pool_destroy(pool);
    return 1;
  }
  nf_stats_get(pool, &s);
  printf("after free: live %llu, allocs %llu, frees %llu\n", (unsigned long long)s.live,
         (unsigned long long)s.allocs, (unsigned long long)s.frees);
  nf_pool_destroy(pool);
  return s.live == 0 ? 0 : 1;
}

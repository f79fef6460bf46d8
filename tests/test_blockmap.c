// The block map (src/core/blockmap.c): the pointer -> live block hash, its
// growth and deletion, with more blocks than its first table holds. Lookups
// of pointers that are not blocks (an interior pointer, NULL) must answer
// "none" at every fill, including the one just before a growth.
#include "nf_test.h"

#include <unistd.h>

#define G (64 * 1024)
#define N 3000

static void test_many_blocks(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, NULL);
  assert_non_null(p);
  static void *b[N];
  alarm(60); // a lookup probing a full table forever fails the test instead of hanging it
  for (int i = 0; i < N; i++) {
    assert_non_null(b[i] = nf_alloc(p, 512, NULL));
    // Not the start of a block: no entry, whatever the table's fill.
    assert_int_equal(nf_block_size(p, (char *)b[i] + 8), 0);
    assert_int_equal(nf_block_size(p, NULL), 0);
  }
  assert_int_equal(nf_pool_check(p), NF_OK); // the hash counts every live block
  uint64_t t[3];
  assert_int_equal(nf_block_tiers(p, NULL, t), NF_ERR_INVALID);
  // Frees in a scattered order (backward-shift deletion moves entries):
  // every remaining block is still found.
  uint64_t seed = nft_env_seed(11);
  for (int i = N - 1; i > 0; i--) { // shuffle
    int j = (int)(nft_rand(&seed) % (uint64_t)(i + 1));
    void *x = b[i];
    b[i] = b[j], b[j] = x;
  }
  for (int i = 0; i < N; i++) {
    assert_int_equal(nf_free(p, b[i]), NF_OK);
    if (i % 97 == 0) {
      for (int k = i + 1; k < N; k++) assert_int_equal(nf_block_size(p, b[k]), 512);
      assert_int_equal(nf_pool_check(p), NF_OK);
    }
  }
  alarm(0);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_many_blocks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

// The one human-readable byte formatter (src/pool.c), shared by the core, the
// torch plug-in and the CLI (tools/ link the static library).
#ifndef NF_FMT_H
#define NF_FMT_H

#include <stddef.h>
#include <stdint.h>

// "2.000 TiB", "1.500 GiB", "2.000 MiB", else exact bytes "4096 B".
void nf__fmt_bytes(char *buf, size_t n, uint64_t bytes);

#endif

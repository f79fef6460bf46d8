// The monitor's shared-memory file: its layout and the reader side. Each pool
// publishes its counters (core/publish.h) into a file
// ($NOFRAG_SHM_DIR, else /dev/shm)/nofrag.<uid>.<pid>.<pool-id>, mode 0600,
// that `nofrag top` (tools/top.c) reads from outside the process. The layout
// only grows at the end: readers accept files of the first layout (later
// fields read 0).
//
// Liveness: a writer flags its file NF_MON_LOCKED and takes an open file
// description read lock (F_OFD_SETLK) on its bytes [0, NF_MON_GUARD_AT)
// before publishing the magic; the lock lasts as long as the writer maps the
// file (monitor.c), so it goes when the pool's mapping does: exec() and a
// zombie's exit included, where the pid lives on. Such a file is alive exactly
// while locked. Files of older writers (flags 0), or where OFD locks are
// missing, are judged by their pid: dead if it is gone, or reused (started
// after the file).
//
// Name guard, the byte at NF_MON_GUARD_AT (no liveness test sees it): a dead
// file is removed by name, and its pid's next writer (after an exec, or a
// reused pid) replaces it under the same name, so a cleaner could delete the
// new, live file. The cleaner keeps open the file it judged, read-locks its
// guard, and unlinks the name only if it still names that file
// (nf__mon_unlink_dead); a writer write-locks the stale file's guard before
// unlinking it (waiting up to a second, else it goes without a file), so the
// name cannot change between the cleaner's check and its unlink.
#ifndef NF_OBSERVE_MONITOR_SHM_H
#define NF_OBSERVE_MONITOR_SHM_H

#include "core/publish.h"

#include <stdbool.h>
#include <stdint.h>

#define NF_MON_MAGIC 0x314e4f4d4746524eull // "NRFGMON1" little-endian
#define NF_MON_VERSION 1
#define NF_MON_LOCKED 1u // flags: the writer holds the liveness lock while it maps the file
#define NF_MON_GUARD_AT (1ll << 30) // the name guard's byte: past any layout (the file is < 1 KiB)

typedef struct nf_mon_shm_s {
  uint64_t magic;    // written last at creation (release): readers skip files without it
  uint32_t version, size;
  int32_t pid;
  uint32_t uid, pool_id;
  uint32_t flags;    // NF_MON_LOCKED; 0 in files of older writers (was reserved, always 0)
  uint64_t start_ns; // CLOCK_REALTIME at pool creation
  char device[32];   // "host", "cuda:0", ...
  nf_pub_t pub;      // the counters (core/publish.h): seq, then the fields
} nf_mon_shm_t;

// Reader side (tools/top.c, tests). One pool's file, read consistently.
typedef struct nf_mon_entry_s {
  char path[512];
  int pid;
  uint32_t uid, pool_id;
  uint32_t flags; // the header's (NF_MON_LOCKED)
  uint64_t start_ns;
  char device[32];
  uint64_t v[NF_PUB_NFIELDS];
  int nfields;          // fields the file holds (an older writer's: fewer; the rest of v reads 0)
  double fragmentation; // 1 - live/mapped, from the same snapshot
} nf_mon_entry_t;

// The directory monitor files go to: $NOFRAG_SHM_DIR, else /dev/shm.
const char *nf__mon_dir(void);
// Read one file: 0 ok, 1 its process is dead, -1 not a monitor file, unreadable
// or torn for too long (a writer killed mid-update).
int nf__mon_read(const char *path, nf_mon_entry_t *e);
// The same, and when it returns 1 with `fd` non-NULL, *fd is the descriptor
// the file was judged on (the caller closes it), for nf__mon_unlink_dead.
int nf__mon_read_fd(const char *path, nf_mon_entry_t *e, int *fd);
// Remove e->path, judged dead on `fd` by nf__mon_read_fd, if it still names
// that file and the file still reads dead; never a file that replaced it
// under the same name. True if removed.
bool nf__mon_unlink_dead(int fd, const nf_mon_entry_t *e);
// Every readable monitor file of live processes in `dir` (NULL: nf__mon_dir()),
// sorted by pid then pool id, as a malloc'd array in *out (free() it). Files of
// dead processes are skipped, and removed when `clean` (nf__mon_unlink_dead);
// *dead (if non-NULL) counts them (with `clean`, those removed). Returns the
// number of entries, or -1 if dir cannot be opened.
long nf__mon_list(const char *dir, bool clean, nf_mon_entry_t **out, long *dead);


#endif

#!/bin/sh
# docs/configuration.md names every configuration key the parser accepts and
# every NOFRAG_* environment variable the code reads, and no key that does not
# exist. Keys come from src/core/config.c (its size-key table and its
# tok_eq(k, "...") tests), variables from getenv / nf__env_on in src/ and
# tools/, and os.environ in python/nofrag/ and setup.py.
# Usage: test_docs.sh SOURCE_DIR
set -eu
src=$1
doc=$src/docs/configuration.md
[ -f "$doc" ] || { echo "missing $doc"; exit 1; }
fail=0

keys=$( (grep -oE '\{"[a-z_]+", offsetof\(nf_config_t' "$src/src/core/config.c" | sed -E 's/\{"([a-z_]+)".*/\1/'
         grep -oE 'tok_eq\(k, "[a-z_]+"\)' "$src/src/core/config.c" | sed -E 's/.*"([a-z_]+)".*/\1/') | sort -u)
[ "$(echo "$keys" | wc -w)" -ge 20 ] || { echo "found only: $keys (did config.c change shape?)"; exit 1; }
for k in $keys; do
  grep -qE "^\| \`$k\` \|" "$doc" || { echo "config key '$k' has no row in docs/configuration.md"; fail=1; }
done
# The reverse: every row of the keys table is a key.
rows=$(sed -n '/^## Keys/,/^## /p' "$doc" | grep -oE '^\| `[a-z_]+` \|' | sed -E 's/^\| `([a-z_]+)`.*/\1/')
for r in $rows; do
  echo "$keys" | grep -qx "$r" || { echo "docs/configuration.md documents '$r', which is not a key"; fail=1; }
done

vars=$( (grep -rhoE '(getenv|nf__env_on)\("NOFRAG_[A-Z_]+"' "$src/src" "$src/tools"
         grep -rhoE "environ(\.get)?[[(]\"NOFRAG_[A-Z_]+\"" "$src/python/nofrag" "$src/setup.py") |
        grep -oE 'NOFRAG_[A-Z_]+' | sort -u)
[ "$(echo "$vars" | wc -w)" -ge 10 ] || { echo "found only: $vars"; exit 1; }
for v in $vars; do
  grep -qE "^\| \`$v\` \|" "$doc" || { echo "environment variable $v has no row in docs/configuration.md"; fail=1; }
done

[ $fail -eq 0 ] && echo "docs/configuration.md: $(echo "$keys" | wc -w) keys, $(echo "$vars" | wc -w) variables"
exit $fail

#!/usr/bin/env bash
# Reference solution (never shown to the agent).
set -euo pipefail
printf 'yes\n' > answer.txt

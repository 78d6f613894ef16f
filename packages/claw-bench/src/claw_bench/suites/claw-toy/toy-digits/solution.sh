#!/usr/bin/env bash
# Reference solution (never shown to the agent).
set -euo pipefail
printf "42 7 1999\n" > answer.txt

#!/usr/bin/env bash
# Live reference check: the draft head goldens regenerated with transformers and torch autograd
# (scripts/make_draft_goldens.py) equal the committed tests/data/draft_goldens/ byte for byte.
exec "$(dirname "$0")/check_regenerated.sh" make_draft_goldens.py draft_goldens

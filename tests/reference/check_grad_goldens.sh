#!/usr/bin/env bash
# Live reference check: the gradient and AdamW goldens regenerated with torch autograd
# (scripts/make_grad_goldens.py) equal the committed tests/data/grad_goldens/ byte for byte.
exec "$(dirname "$0")/check_regenerated.sh" make_grad_goldens.py grad_goldens

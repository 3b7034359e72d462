#!/usr/bin/env python3
"""The folder tree is the architecture: fails on any #include that runs up a layer or reaches
another layer's private header.

Layers, bottom to top (a folder may include its own headers and the public headers of the
layers below it, never above):

  core        src/*, public headers include/miles/*.h
  rollout     rollout/,    public headers include/miles/rollout/
  trainer     trainer/,    public headers include/miles/trainer/
  report      report/      (the core only)
  weight_sync weight_sync/, public headers include/miles/weight_sync/
  controller  controller/, public headers include/miles/controller/
  cli         cli/         (the program: every layer's public headers)

rollout, trainer and report sit side by side: none includes another. A header under a layer's
folder (rollout/engine_impl.h) is that layer's private header; other layers use its public
headers under include/miles/<layer>/. Tests (tests/) may include anything.

Usage: scripts/check_layers.py [--graph]   (--graph prints the layer graph with edge counts)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (rank, the layers it may include besides its own)
LAYERS = {
    "core": (0, set()),
    "rollout": (1, {"core"}),
    "trainer": (1, {"core"}),
    "report": (1, {"core"}),
    "weight_sync": (2, {"core", "rollout", "trainer"}),
    "controller": (3, {"core", "rollout", "trainer", "weight_sync", "report"}),
    "cli": (4, {"core", "rollout", "trainer", "weight_sync", "controller", "report"}),
}
SOURCE_FOLDERS = {"src": "core", "rollout": "rollout", "trainer": "trainer", "report": "report",
                  "weight_sync": "weight_sync", "controller": "controller", "cli": "cli"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of_source(rel):
    """The layer a file in the tree belongs to, and whether it is a public header."""
    parts = rel.split("/")
    if parts[0] == "include" and len(parts) >= 3 and parts[1] == "miles":
        if len(parts) == 3:
            return "core", True
        return parts[2], True
    if parts[0] in SOURCE_FOLDERS:
        return SOURCE_FOLDERS[parts[0]], False
    return None, False


def resolve(including_rel, name):
    """The repository path an #include "name" names (the search order of the build)."""
    here = os.path.dirname(including_rel)
    for base in (here, "include", "src", ""):
        cand = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(ROOT, cand)):
            return cand
    return None  # generated (miles/v1/*.pb.h) or a system header in quotes


def files():
    for top in ["include"] + list(SOURCE_FOLDERS):
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            for n in names:
                if n.endswith((".h", ".cc", ".cu", ".cuh")):
                    yield os.path.relpath(os.path.join(dirpath, n), ROOT)


def main():
    violations, graph = [], {}
    for rel in sorted(files()):
        src_layer, _ = layer_of_source(rel)
        if src_layer is None:
            continue
        with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for name in INCLUDE.findall(text):
            target = resolve(rel, name)
            if target is None:
                continue
            dst_layer, public = layer_of_source(target)
            if dst_layer is None or dst_layer == src_layer:
                continue
            graph[(src_layer, dst_layer)] = graph.get((src_layer, dst_layer), 0) + 1
            if dst_layer not in LAYERS[src_layer][1]:
                violations.append(f"{rel}: includes {target}: {src_layer} may not depend on "
                                  f"{dst_layer}")
            elif not public:
                home = "include/miles/" if dst_layer == "core" else f"include/miles/{dst_layer}/"
                violations.append(f"{rel}: includes {target}, a private header of {dst_layer} "
                                  f"(use or add a public one under {home})")
    if "--graph" in sys.argv:
        for (a, b), n in sorted(graph.items(), key=lambda e: (LAYERS[e[0][0]][0], e[0])):
            print(f"{a:12s} -> {b:12s} {n:4d} includes")
    for v in violations:
        print(v)
    if violations:
        print(f"check_layers: {len(violations)} include(s) against the layering "
              f"(scripts/check_layers.py explains it)")
        return 1
    print("check_layers: every include runs down the layers to a public header")
    return 0


if __name__ == "__main__":
    sys.exit(main())

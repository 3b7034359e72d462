#!/usr/bin/env python3
"""Architecture measures of one source tree, for the before/after comparison of issue 28:
how the code splits into layers, whether includes respect the layering, how long functions are.

1. Lines per layer: files and non-blank lines of .cc/.h/.cu/.cuh/.proto in the layers of
   scripts/check_layers.py (core: src/ and top-level include/miles/*.h; rollout, trainer, report,
   weight_sync, controller; cli: cli/, or src/cli/ in the old layout), plus tests/ and proto/.
   Old layout (no include/miles/<layer>/): a flat header X.h goes by the first rule that fits:
   a. the layer of a non-test X.cc/X.cu; b. the one layer of all non-test X_*.cc/X_*.cu; c. the
   layer named X; d. the lowest layer (rank, then most includes) whose non-test .cc/.cu files
   include it; e. core.
2. Include graph: #include "..." edges from layer A to headers of layer B != A, resolved as the
   build does (includer's folder, include/, src/, root). Against the layering: up (B ranks above
   A), sideways (same rank, e.g. rollout -> trainer), private (B's header not under include/).
   tests/ may include anything (in the matrix, never against the layering).
3. The 15 longest non-test C++ functions. Comments, literals (raw strings too) and preprocessor
   lines are blanked, braces matched. A '{' at namespace/class/file scope opens a function body
   when the text since the last ';', '{' or '}' has a '(', no '=' before it (operator= aside),
   and is no namespace/class/struct/enum/union/extern head (template<...> ignored); braces of an
   initialiser list (`: a_{x}`) are passed over. Length: the '{' line to the matching '}' line,
   both included; lambdas and nested blocks count within their function.
4. `duplicates --repo ROOT` (if on PATH): pairs in the whole tree, and listed pairs outside tests/.

Usage: scripts/layer_stats.py [ROOT] [--title TEXT] [--no-duplicates]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
from check_layers import LAYERS  # noqa: E402  name -> (rank, the layers it may include)

ORDER = list(LAYERS) + ["tests", "proto"]
FOLDERS = {"src": "core", "tests": "tests", "proto": "proto", **{l: l for l in LAYERS if l != "core"}}
CXX = (".cc", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
TEMPLATE = re.compile(r"\btemplate\s*<(?:[^<>]|<[^<>]*>)*>")
SCOPE_HEAD = re.compile(r"\b(namespace|class|struct|enum|union)\b|^\s*extern\b")


def folder_layer(rel):
    parts = rel.split("/")
    return "cli" if parts[:2] == ["src", "cli"] and len(parts) > 2 else FOLDERS.get(parts[0])


class Tree:
    def __init__(self, root):
        self.root, self.texts = root, {}
        for top in ["include"] + list(FOLDERS):
            for d, _, names in os.walk(os.path.join(root, top)):
                for n in names:
                    if n.endswith(CXX + (".proto",)):
                        rel = os.path.relpath(os.path.join(d, n), root)
                        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                            self.texts[rel] = f.read()
        self.files = sorted(self.texts)
        self.old_layout = not any(os.path.isdir(os.path.join(root, "include/miles", l))
                                  for l in LAYERS if l != "core")
        self.flat = {r: self.place_flat(r) for r in self.files if self.old_layout
                     and r.startswith("include/miles/") and r.count("/") == 2}

    def layer(self, rel):
        """(layer, public?) of a file of the tree."""
        parts = rel.split("/")
        if parts[:2] == ["include", "miles"]:
            return (self.flat.get(rel, ("core",))[0] if len(parts) == 3 else parts[2]), True
        return folder_layer(rel), False

    def place_flat(self, header):
        stem = os.path.basename(header)[:-2]
        srcs = [r for r in self.files if r.endswith((".cc", ".cu")) and folder_layer(r) in LAYERS]
        same = [folder_layer(r) for r in srcs if os.path.basename(r).rsplit(".", 1)[0] == stem]
        prefixed = {folder_layer(r) for r in srcs if os.path.basename(r).startswith(stem + "_")}
        users = {}
        for r in srcs:
            if any(self.resolve(r, n) == header for n in INCLUDE.findall(self.texts[r])):
                users[folder_layer(r)] = users.get(folder_layer(r), 0) + 1
        if same:
            return same[0], "a"
        if len(prefixed) == 1:
            return prefixed.pop(), "b"
        if stem in LAYERS:
            return stem, "c"
        if users:
            return min(users, key=lambda l: (LAYERS[l][0], -users[l])), "d"
        return "core", "e"

    def resolve(self, including, name):
        for base in (os.path.dirname(including), "include", "src", ""):
            cand = os.path.normpath(os.path.join(base, name))
            if cand in self.texts or os.path.isfile(os.path.join(self.root, cand)):
                return cand
        return None  # generated (*.pb.h) or a system header in quotes


def strip_code(text):
    """Comments, literals and preprocessor lines blanked; every newline kept in place."""
    out, i, n, line_start = [], 0, len(text), True
    while i < n:
        c = text[i]
        if line_start and text[i:i + 200].lstrip(" \t")[:1] == "#":
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c == "R" and text.startswith('"', i + 1) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            j = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if j < 0 else j + len(m.group(1)) + 2
        elif c == '"' or (c == "'" and not (text[i - 1:i].isdigit() and text[i + 1:i + 2].isalnum())):
            j = i + 1
            while j < n and text[j] not in (c, "\n"):
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(c)
            line_start = c == "\n" or (line_start and c in " \t")
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        line_start, i = j > 0 and text[j - 1] == "\n", j
    return "".join(out)


def functions(rel, text):
    """(length, rel:line, name) of each function body at namespace, class or file scope."""
    found, stack, head, line, head_line = [], [], "", 1, 1  # stack: (kind, line, name, head line)
    for c in strip_code(text):
        line += c == "\n"
        in_scope = all(k[0] == "scope" for k in stack)
        if c == "{":
            before = re.sub(r"operator\s*\S+", "", head).split("(")[0]
            if not in_scope:
                stack.append(("other",))
            elif SCOPE_HEAD.search(TEMPLATE.sub("", head).split("(")[0]):
                stack.append(("scope",))
            elif "(" in head and "=" not in before and re.search(r"\)\s*:[^:]", head) \
                    and re.search(r"[\w>]\s*$", head):
                stack.append(("init",))  # member{...} in a constructor's initialiser list
                head += "{"
                continue
            elif "(" in head and "=" not in before:
                pre = re.sub(r"<[^<>()]*>", "", re.sub(r"<[^<>()]*>", "", head.split("(")[0]))
                name = (re.findall(r"(operator\s*\S*|~?[\w:]+)\s*$", pre) or ["?"])[0]
                stack.append(("func", line, name + "()" * name.endswith("operator"), head_line))
            else:
                stack.append(("other",))
            head = ""
        elif c == "}" and stack:
            top = stack.pop()
            if top[0] == "init":
                head += "}"
                continue
            if top[0] == "func":  # length, where, name
                found.append((line - top[1] + 1, f"{rel}:{top[3]}", top[2]))
            if all(k[0] == "scope" for k in stack):
                head = ""
        elif in_scope:
            if not head.strip() and not c.isspace():
                head_line = line
            head = "" if c == ";" else head + c
    return found


def duplicates(root):
    if not shutil.which("duplicates"):
        return "`duplicates` is not on PATH"
    try:
        out = subprocess.run(["duplicates", "--repo", root, "--most", "200", "--seconds", "120"],
                             capture_output=True, text=True, timeout=180).stdout
    except subprocess.TimeoutExpired:
        return "did not finish within 180 s"
    lines = out.strip().splitlines() or ["(no output)"]
    rows = [re.findall(r"(\S+):\d+-\d+", l) for l in lines if re.match(r"D\d+ ", l)]
    clean = sum(1 for r in rows if not any(p.startswith("tests/") for p in r))
    extra = [l for l in lines if l.startswith(("incomplete:", "(+"))]
    return (f"{lines[0]}\n\nOf the {len(rows)} pairs listed, {clean} have neither side under "
            f"tests/." + "".join(f"\n\n{l}" for l in extra))


def report(root, title, run_duplicates):
    t, p = Tree(root), print
    p(f"## {title}\n\nTree: `{root}`, layout: "
      f"{'old (every header flat in include/miles/)' if t.old_layout else 'layered'}\n")
    counts = {l: [0, 0] for l in ORDER + ["other"]}
    for rel in t.files:
        c = counts[t.layer(rel)[0] or "other"]
        c[0] += 1
        c[1] += sum(1 for l in t.texts[rel].splitlines() if l.strip())
    p("### Lines per layer\n\n| layer | files | non-blank lines |\n| --- | ---: | ---: |")
    for l, (nf, nl) in counts.items():
        if nf or l != "other":
            p(f"| {l} | {nf} | {nl} |")
    p(f"| **all** | {len(t.files)} | {sum(v[1] for v in counts.values())} |\n")
    if t.flat:
        p("Flat headers placed by the first rule that fits (a: same-stem .cc/.cu; b: all stem_*.cc "
          "in one layer; c: named after a layer; d: lowest layer whose .cc files include it; "
          "e: core):\n")
        for l in ORDER:
            hs = [f"{os.path.basename(h)} ({r})" for h, (hl, r) in sorted(t.flat.items()) if hl == l]
            if hs:
                p(f"- {l}: {', '.join(hs)}")
        p()
    graph, kinds, unresolved, bad = {}, {"up": 0, "sideways": 0, "private": 0}, 0, []
    for rel in (r for r in t.files if r.endswith(CXX) and t.layer(r)[0]):
        a = t.layer(rel)[0]
        for name in INCLUDE.findall(t.texts[rel]):
            target = t.resolve(rel, name)
            b, public = t.layer(target) if target else (None, False)
            unresolved += target is None
            if b is None or b == a:
                continue
            graph[(a, b)] = graph.get((a, b), 0) + 1
            if a == "tests":
                continue
            kind = ("private" if not public else None) if b in LAYERS[a][1] else \
                ("up" if LAYERS[b][0] > LAYERS[a][0] else "sideways")
            if kind:
                kinds[kind] += 1
                bad.append(f"{rel} -> {target} ({kind})")
    cols = [l for l in ORDER if any(k[1] == l for k in graph)]
    p("### Include graph between layers\n\nRow layer includes column layer (edges; own layer left "
      "out).\n\n| from \\ to | " + " | ".join(cols) + " |\n| --- |" + " ---: |" * len(cols))
    for a in ORDER:
        if any(k[0] == a for k in graph):
            p(f"| {a} | " + " | ".join(str(graph.get((a, b), "")) for b in cols) + " |")
    p(f"\nEdges against the layering (tests excepted): **{kinds['up']} up**, **{kinds['sideways']} "
      f"sideways**, **{kinds['private']} to another layer's private header**; {len(bad)} in all. "
      f"Quoted includes not in the tree (generated or system): {unresolved}.\n")
    for b in bad:
        p(f"- {b}")
    funcs = sorted((f for r in t.files if r.endswith(CXX) and t.layer(r)[0] not in (None, "tests")
                    for f in functions(r, t.texts[r])), key=lambda f: (-f[0], f[1]))
    p(f"\n### 15 longest functions (non-test C++; {len(funcs)} functions found)\n\n"
      "| lines | where | function |\n| ---: | --- | --- |")
    for length, where, name in funcs[:15]:
        p(f"| {length} | {where} | `{name}` |")
    p(f"\nFunctions over 100 lines: {sum(f[0] > 100 for f in funcs)}; over 60 lines: "
      f"{sum(f[0] > 60 for f in funcs)}.\n")
    if run_duplicates:
        p(f"### duplicates\n\n`duplicates --repo {root} --most 200`: {duplicates(root)}\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Architecture measures of a source tree (issue 28).")
    ap.add_argument("root", nargs="?", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--title", default="Architecture measures")
    ap.add_argument("--no-duplicates", action="store_true", help="skip the duplicates command")
    a = ap.parse_args()
    report(os.path.abspath(a.root), a.title, not a.no_duplicates)

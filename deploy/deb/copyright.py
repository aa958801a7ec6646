#!/usr/bin/env python3
"""Write the Debian package's copyright file (machine-readable format, DEP-5) to stdout.

Generated from `cargo metadata`, never kept by hand: one Files paragraph for gpumesh itself and
one for every Rust crate compiled into gpu-agent and gpuctl (the crates reached from them through
normal dependencies on this host's target; build dependencies and proc-macro crates run only at
compile time and ship nothing). Each crate's paragraph gives its declared license and the
copyright lines of its own license files (else its authors). Every license named gets a
standalone License paragraph: Apache-2.0 points at /usr/share/common-licenses, the others carry
their text from deploy/deb/licenses/. A license without a text there stops the build, so a new
dependency under a license nobody looked at cannot be packaged silently (deny.toml decides which
licenses are allowed at all; this file only documents them).

    deploy/deb/copyright.py [--manifest-path Cargo.toml]
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOTS = ("gpu-agent", "gpuctl")
UPSTREAM = {
    "name": "gpumesh",
    "contact": "gpumesh maintainers <maintainers@gpumesh.dev>",
}
# Licenses Debian ships in /usr/share/common-licenses: referred to, not copied (lintian).
COMMON = {"Apache-2.0": "Apache-2.0"}
# C and assembly sources some crates carry and compile in, under licenses of their own that the
# crate's declared license does not state: crate -> (files inside it, SPDX id, file with its
# copyright lines).
FOREIGN_SOURCES = {
    "tikv-jemalloc-sys": ("jemalloc/*", "BSD-2-Clause", "jemalloc/COPYING"),
}
LICENSE_FILE = re.compile(r"^(LICEN[SC]E|COPYING|COPYRIGHT|NOTICE)", re.IGNORECASE)
COPYRIGHT_LINE = re.compile(r"^\s*(Copyright|\(c\)|©)\b.*\d{4}", re.IGNORECASE)
TEMPLATE = re.compile(r"\[yyyy\]|<year>|\[year\]|<owner>|\[name of copyright owner\]")


def metadata(manifest):
    host = subprocess.run(
        ["rustc", "-vV"], check=True, capture_output=True, text=True
    ).stdout
    target = re.search(r"^host: (\S+)$", host, re.MULTILINE).group(1)
    out = subprocess.run(
        [
            "cargo", "metadata", "--format-version", "1", "--locked",
            "--filter-platform", target, "--manifest-path", str(manifest),
        ],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def bundled(meta):
    """The third-party packages linked into the root binaries."""
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    members = set(meta["workspace_members"])
    todo = [i for i in members if packages[i]["name"] in ROOTS]
    seen = set()
    while todo:
        pkg = todo.pop()
        if pkg in seen:
            continue
        seen.add(pkg)
        for dep in nodes[pkg]["deps"]:
            normal = any(k["kind"] is None for k in dep["dep_kinds"])
            target = packages[dep["pkg"]]
            macro = any("proc-macro" in t["kind"] for t in target["targets"])
            if normal and not macro:
                todo.append(dep["pkg"])
    return sorted(
        (packages[i] for i in seen - members),
        key=lambda p: (p["name"], p["version"]),
    )


def spdx_ids(expr):
    """The license and exception identifiers of an SPDX expression (crates.io's old `/`
    meaning OR included)."""
    words = re.findall(r"[A-Za-z0-9.+-]+", expr.replace("/", " OR "))
    return [w for w in words if w not in ("OR", "AND", "WITH")]


def dep5_expr(expr):
    """An SPDX expression in DEP-5's syntax: lower-case `or`/`and`, `A with X exception`, and
    a comma ending a parenthesised disjunction before `and` (`A or B, and C`)."""
    e = re.sub(r"\s*/\s*", " OR ", expr.strip())
    e = re.sub(r"\s+WITH\s+([A-Za-z0-9.+-]+)", lambda m: f" with {exception_name(m.group(1))}", e)
    e = re.sub(r"\)\s+AND\s+", ", and ", e)
    e = e.replace("(", "").replace(")", "")
    e = re.sub(r"\s+OR\s+", " or ", e)
    e = re.sub(r"\s+AND\s+", " and ", e)
    return e


def exception_name(spdx):
    """`LLVM-exception` → `LLVM exception` (DEP-5: `with <keywords> exception`)."""
    return spdx[: -len("-exception")] + " exception" if spdx.endswith("-exception") else spdx


def license_names(expr):
    """The DEP-5 license names a Files paragraph with this expression uses: each alternative,
    an exception joined to the license it qualifies."""
    names = []
    for part in re.split(r",? and | or ", dep5_expr(expr)):
        part = part.strip()
        if part:
            names.append(part)
    return names


def copyright_lines(package):
    lines = []
    root = Path(package["manifest_path"]).parent
    for f in sorted(root.iterdir()):
        if not (f.is_file() and LICENSE_FILE.match(f.name)):
            continue
        for line in f.read_text(errors="replace").splitlines():
            line = line.strip()
            if COPYRIGHT_LINE.match(line) and not TEMPLATE.search(line) and line not in lines:
                lines.append(line)
    if not lines:
        lines = list(package.get("authors") or []) or [f"the {package['name']} authors"]
    return [re.sub(r"^Copyright\s*(\(c\)|©)?\s*", "", l, flags=re.IGNORECASE) or l for l in lines]


def field(name, lines):
    """A DEP-5 field whose value spans lines (continuation lines start with a space)."""
    first, *rest = lines
    return "\n".join([f"{name}: {first}"] + [f" {l}" if l else " ." for l in rest])


def license_paragraph(name):
    base, _, exception = name.partition(" with ")
    body = []
    if base in COMMON:
        body.append(
            f"On Debian systems, the full text of the {base} license can be found in"
        )
        body.append(f"/usr/share/common-licenses/{COMMON[base]}.")
    else:
        body.extend(text_of(base))
    if exception:
        spdx = exception.replace(" exception", "-exception")
        body.append("")
        body.extend(text_of(spdx))
    return field("License", [name] + body)


def text_of(spdx):
    path = HERE / "licenses" / spdx
    if not path.is_file():
        raise SystemExit(
            f"copyright.py: no text for license {spdx}: add deploy/deb/licenses/{spdx} "
            "(and check deny.toml allows it)"
        )
    return path.read_text().rstrip("\n").splitlines()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest-path", default=HERE.parent.parent / "Cargo.toml")
    args = parser.parse_args()
    meta = metadata(args.manifest_path)
    crates = bundled(meta)

    out = [
        "\n".join([
            "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/",
            f"Upstream-Name: {UPSTREAM['name']}",
            f"Upstream-Contact: {UPSTREAM['contact']}",
            "Source: https://github.com/gpumesh/gpumesh",
            field("Comment", [
                "Generated from `cargo metadata` when the package was built",
                "(deploy/deb/copyright.py). The vendor/<crate>-<version>/* paragraphs are",
                "the Rust crates compiled into gpu-agent and gpuctl, as",
                "`cargo vendor --versioned-dirs` would lay them out; their sources are",
                "on crates.io.",
            ]),
        ]),
        "\n".join([
            "Files: *",
            "Copyright: the gpumesh authors",
            "License: Apache-2.0",
        ]),
    ]
    used = {"Apache-2.0"}
    for c in crates:
        expr = c.get("license")
        if not expr:
            raise SystemExit(
                f"copyright.py: {c['name']} {c['version']} declares no SPDX license "
                f"(license-file: {c.get('license_file')}); deny.toml must clarify it"
            )
        used.update(license_names(expr))
        out.append("\n".join([
            f"Files: vendor/{c['name']}-{c['version']}/*",
            field("Copyright", copyright_lines(c)),
            f"License: {dep5_expr(expr)}",
            f"Comment: {c['name']} {c['version']}, declared license: {expr}",
        ]))
        if c["name"] in FOREIGN_SOURCES:
            files, spdx, notice = FOREIGN_SOURCES[c["name"]]
            root = Path(c["manifest_path"]).parent
            lines = [
                re.sub(r"^Copyright\s*(\(c\)|©)?\s*", "", l.strip(), flags=re.IGNORECASE)
                for l in (root / notice).read_text(errors="replace").splitlines()
                if COPYRIGHT_LINE.match(l)
            ]
            used.add(spdx)
            out.append("\n".join([
                f"Files: vendor/{c['name']}-{c['version']}/{files}",
                field("Copyright", lines or [f"the authors of {files}"]),
                f"License: {spdx}",
                f"Comment: sources compiled into {c['name']} under their own license",
            ]))
    for name in sorted(used):
        out.append(license_paragraph(name))
    sys.stdout.write("\n\n".join(out) + "\n")


if __name__ == "__main__":
    main()

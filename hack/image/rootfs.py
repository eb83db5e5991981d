#!/usr/bin/env python3
"""Print layer entry lines (hack/image/oci.py's format) for what an image's files need from this machine.

    rootfs.py libs BINARY...                 the shared libraries `ldd` lists for each, at the same paths
    rootfs.py users DIR                      write DIR/passwd and DIR/group (root, nonroot 65532) and print
                                             their entries as /etc/passwd and /etc/group
    rootfs.py python PYTHON VENV DEST STAGE  a CPython runtime: the interpreter, its libraries, the standard
                                             library without tests, GUI, build and installer parts, and the
                                             venv's site-packages without pip and setuptools, under DEST
                                             (e.g. /usr/local); no .pyc files (the image sets
                                             PYTHONDONTWRITEBYTECODE); ELF files are stripped into STAGE
"""

import os
import re
import subprocess
import sys

# Where ld.so looks when there is no /etc/ld.so.cache (none in these images): Debian's built-in paths.
SYSTEM_LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/lib", "/usr/lib")
LIB_DIR = "/usr/lib/x86_64-linux-gnu"

# Standard-library parts an app in a container never imports: tests, Tk, IDLE, installers, build files.
STDLIB_SKIP_DIRS = {"test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
                    "distutils", "venv", "pydoc_data", "__pycache__", "site-packages"}
STDLIB_SKIP_PREFIXES = ("config-",)  # config-3.11-x86_64-linux-gnu: the static libpython and Makefile
DYNLOAD_SKIP = re.compile(r"^(_tkinter|_test\w*|xxlimited\w*|_xx\w*|_ctypes_test|readline|_curses\w*|_dbm|"
                          r"_gdbm)\.")
SITE_SKIP = re.compile(r"^(pip|setuptools|_distutils_hack|pkg_resources|wheel)([-_.].*)?$|^distutils-precedence")

LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$")


def parse_ldd(text):
    """The absolute library paths in `ldd` output, the loader included, linux-vdso (no file) left out."""
    paths = []
    for line in text.splitlines():
        if "not found" in line:
            raise ValueError(f"ldd: a library is missing: {line.strip()}")
        match = LDD_LINE.match(line)
        if match:
            paths.append(match.group(2))
    return paths


def image_lib_path(path):
    """Where a library goes in the image: its own path in a system directory, else LIB_DIR."""
    if os.path.dirname(path) in SYSTEM_LIB_DIRS:
        return path
    return f"{LIB_DIR}/{os.path.basename(path)}"


def ldd(binaries):
    """{image path: host path} of every shared library the binaries load (ldd lists the whole closure)."""
    libs = {}
    for binary in binaries:
        result = subprocess.run(["ldd", binary], capture_output=True, text=True)
        if "not a dynamic executable" in result.stdout + result.stderr:
            continue
        if result.returncode != 0:
            raise SystemExit(f"rootfs: ldd {binary} failed: {result.stderr.strip()}")
        for path in parse_ldd(result.stdout):
            libs[image_lib_path(path)] = path
    return libs


def lib_lines(libs):
    return [f"file {dest} 0755 {src}" for dest, src in sorted(libs.items())]


def users_text():
    passwd = ("root:x:0:0:root:/root:/sbin/nologin\n"
              "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")
    group = "root:x:0:\nnonroot:x:65532:\n"
    return passwd, group


def walk_files(top, skip_dir):
    """Relative paths of the regular files (and symlinks to files) under top, skipping dirs skip_dir names."""
    found = []
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not skip_dir(d))
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")):
                found.append(os.path.relpath(os.path.join(root, name), top))
    return found


def stripped(src, stage):
    """A copy of the ELF file src without symbols or debug info, under stage (same inputs, same bytes)."""
    out = os.path.join(stage, src.lstrip("/"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    subprocess.run(["strip", "--strip-unneeded", "-o", out, src], check=True)
    return out


def python_lines(python, venv, dest, stage):
    """Entry lines for a CPython runtime under dest, with the venv's packages in its site-packages."""
    python = os.path.realpath(python)
    ver = "python{}.{}".format(*subprocess.check_output(
        [python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"], text=True).split())
    stdlib = subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                                     text=True).strip()
    site = os.path.join(venv, "lib", ver, "site-packages")
    lines = [f"file {dest}/bin/{ver} 0755 {stripped(python, stage)}", f"symlink {dest}/bin/python3 {ver}"]
    binaries = [python]
    for rel in walk_files(stdlib, lambda d: d in STDLIB_SKIP_DIRS or d.startswith(STDLIB_SKIP_PREFIXES)):
        if rel.startswith("lib-dynload/") and DYNLOAD_SKIP.match(os.path.basename(rel)):
            continue
        src = os.path.join(stdlib, rel)
        if rel.endswith(".so"):
            binaries.append(src)
            src = stripped(src, stage)
        lines.append(f"file {dest}/lib/{ver}/{rel} {'0755' if rel.endswith('.so') else '0644'} {src}")
    for rel in walk_files(site, lambda d: d == "__pycache__"):
        if SITE_SKIP.match(rel.split("/", 1)[0]):
            continue
        src, is_elf = os.path.join(site, rel), ".so" in os.path.basename(rel)
        if is_elf:
            binaries.append(src)
            src = stripped(src, stage)
        lines.append(f"file {dest}/lib/{ver}/site-packages/{rel} {'0755' if is_elf else '0644'} {src}")
    # Debian's libraries come stripped already; the interpreter's own libpython may not.
    libs = {image: host if os.path.dirname(host) in SYSTEM_LIB_DIRS else stripped(host, stage)
            for image, host in ldd(binaries).items()}
    return lines + lib_lines(libs)


def main(argv):
    if len(argv) >= 2 and argv[0] == "libs":
        print("\n".join(lib_lines(ldd(argv[1:]))))
    elif len(argv) == 2 and argv[0] == "users":
        for name, text in zip(("passwd", "group"), users_text()):
            with open(os.path.join(argv[1], name), "w", encoding="utf-8") as f:
                f.write(text)
            print(f"file /etc/{name} 0644 {os.path.join(argv[1], name)}")
    elif len(argv) == 5 and argv[0] == "python":
        print("\n".join(python_lines(*argv[1:])))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""Write an OCI image layout as one reproducible tar from lists of (source, destination, mode) files.

Stdlib only. The same inputs give the same bytes, so the same digests: layer entries are sorted, every
mtime is SOURCE_DATE_EPOCH, owners are 0:0 unless an entry says otherwise, tar headers are GNU (never pax,
so no extended time records), gzip carries no file name and mtime 0, and JSON is written with sorted keys.

A layer is described by a text file, one entry a line (blank lines and lines starting with # ignored):

    file    DEST MODE SOURCE      a regular file copied from SOURCE (symlinks followed)
    dir     DEST MODE             a directory
    symlink DEST TARGET           a symbolic link

DEST is an absolute path in the image; MODE is octal (0755, 1777); each may end with :UID:GID to own the
entry (default 0:0). Parent directories that no entry names are added with mode 0755, owned by root.

    oci.py --ref localhost/consistd:0.1.0 --layer files.txt --epoch 1700000000 \\
           --config '{"User": "65532:65532", "Entrypoint": ["/consistd"]}' --out consistd.tar

prints one JSON line: ref, manifest digest, compressed and uncompressed sizes.
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import posixpath
import sys
import tarfile
from dataclasses import dataclass

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
# containerd's importer names the image after this annotation on the index entry (ctr images import).
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class Entry:
    """One thing in a layer: kind is "file", "dir" or "symlink"; source is a host path or a link target."""

    kind: str
    dest: str
    mode: int = 0o755
    source: str = ""
    uid: int = 0
    gid: int = 0


def parse_entries(text, where="<layer>"):
    """Entries from the line format in this module's docstring; ValueError names the line."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        kind, rest = words[0], words[1:]
        wanted = {"file": 3, "dir": 2, "symlink": 2}.get(kind)
        if wanted is None or len(rest) != wanted:
            raise ValueError(f"{where}:{number}: expected 'file DEST MODE SOURCE', 'dir DEST MODE' or "
                             f"'symlink DEST TARGET', got {line!r}")
        dest = rest[0]
        if kind == "symlink":
            entries.append(Entry("symlink", dest, 0o777, rest[1]))
            continue
        mode, _, owner = rest[1].partition(":")
        uid, _, gid = owner.partition(":") if owner else ("0", "", "0")
        entries.append(Entry(kind, dest, int(mode, 8), rest[2] if kind == "file" else "", int(uid), int(gid)))
    return entries


def _member(path, kind, mode, uid, gid, mtime, size=0, link=""):
    info = tarfile.TarInfo(path)
    info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE}[kind]
    info.mode, info.uid, info.gid, info.mtime, info.size, info.linkname = mode, uid, gid, mtime, size, link
    info.uname = info.gname = ""
    return info


def layer_tar(entries, mtime):
    """The uncompressed layer: entries and their missing parent directories, sorted by path."""
    by_path = {}
    for entry in entries:
        if not entry.dest.startswith("/") or posixpath.normpath(entry.dest) != entry.dest or entry.dest == "/":
            raise ValueError(f"destination must be a normalised absolute path: {entry.dest!r}")
        if entry.dest in by_path:
            raise ValueError(f"two entries for {entry.dest}")
        by_path[entry.dest] = entry
    for dest in list(by_path):
        parent = posixpath.dirname(dest)
        while parent != "/" and parent not in by_path:
            by_path[parent] = Entry("dir", parent, 0o755)
            parent = posixpath.dirname(parent)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for dest in sorted(by_path):
            entry, name = by_path[dest], dest.lstrip("/")
            if entry.kind == "file":
                with open(entry.source, "rb") as f:
                    data = f.read()
                info = _member(name, "file", entry.mode, entry.uid, entry.gid, mtime, len(data))
                tar.addfile(info, io.BytesIO(data))
            elif entry.kind == "dir":
                tar.addfile(_member(name + "/", "dir", entry.mode, entry.uid, entry.gid, mtime))
            else:
                tar.addfile(_member(name, "symlink", 0o777, entry.uid, entry.gid, mtime, link=entry.source))
    return out.getvalue()


def gzip_bytes(data):
    """gzip with no file name and mtime 0 in its header, so equal input gives equal output."""
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as f:
        f.write(data)
    return out.getvalue()


def canonical_json(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def descriptor(media_type, data, **extra):
    return {"mediaType": media_type, "digest": sha256(data), "size": len(data), **extra}


def split_ref(ref):
    """("localhost/consistd", "0.1.0") from "localhost/consistd:0.1.0"; a tag is required."""
    name, sep, tag = ref.rpartition(":")
    if not sep or not name or "/" in tag or not tag:
        raise ValueError(f"image reference needs a tag: {ref!r}")
    return name, tag


def build_image(ref, layers, config, epoch, architecture="amd64", os_name="linux"):
    """The layout's files: {path in the layout tar: bytes}. layers: lists of Entry; config: the image
    config's "config" object (User, Entrypoint, Cmd, Env, Labels, WorkingDir, ...)."""
    _, tag = split_ref(ref)
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    blobs, layer_descs, diff_ids = {}, [], []
    for entries in layers:
        raw = layer_tar(entries, epoch)
        packed = gzip_bytes(raw)
        diff_ids.append(sha256(raw))
        layer_descs.append(descriptor(MEDIA_LAYER, packed))
        blobs[sha256(packed)] = packed
    image_config = canonical_json({
        "architecture": architecture,
        "os": os_name,
        "created": created,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": created, "created_by": "hack/image/oci.py"} for _ in layers],
    })
    blobs[sha256(image_config)] = image_config
    manifest = canonical_json({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": descriptor(MEDIA_CONFIG, image_config),
        "layers": layer_descs,
    })
    blobs[sha256(manifest)] = manifest
    index = canonical_json({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [descriptor(MEDIA_MANIFEST, manifest,
                                 platform={"architecture": architecture, "os": os_name},
                                 annotations={ANNOTATION_CONTAINERD_NAME: ref, ANNOTATION_REF_NAME: tag})],
    })
    files = {"oci-layout": canonical_json({"imageLayoutVersion": "1.0.0"}), "index.json": index}
    for digest, data in blobs.items():
        files["blobs/sha256/" + digest.split(":", 1)[1]] = data
    return files


def layout_tar(files, epoch):
    """The layout as a tar: directories then files, sorted, root-owned, mtime epoch."""
    entries = {"blobs/": None, "blobs/sha256/": None, **files}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(entries):
            data = entries[name]
            if data is None:
                tar.addfile(_member(name, "dir", 0o755, 0, 0, epoch))
            else:
                tar.addfile(_member(name, "file", 0o644, 0, 0, epoch, len(data)), io.BytesIO(data))
    return out.getvalue()


def summary(ref, files):
    """What a build reports: the manifest digest containerd shows, and the image's sizes."""
    index = json.loads(files["index.json"])
    manifest_desc = index["manifests"][0]
    manifest = json.loads(files["blobs/sha256/" + manifest_desc["digest"].split(":", 1)[1]])
    compressed = sum(layer["size"] for layer in manifest["layers"])
    uncompressed = 0
    for layer in manifest["layers"]:
        blob = files["blobs/sha256/" + layer["digest"].split(":", 1)[1]]
        uncompressed += len(gzip.decompress(blob))
    return {"ref": ref, "digest": manifest_desc["digest"], "compressed_bytes": compressed,
            "uncompressed_bytes": uncompressed}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ref", required=True, help="full reference, e.g. localhost/consistd:0.1.0")
    parser.add_argument("--layer", action="append", required=True, help="a layer's entry file (repeatable)")
    parser.add_argument("--config", default="{}", help="the image config's config object, as JSON")
    parser.add_argument("--epoch", type=int, required=True, help="SOURCE_DATE_EPOCH: every mtime and created")
    parser.add_argument("--out", required=True, help="the layout tar to write")
    args = parser.parse_args(argv)
    layers = []
    for path in args.layer:
        with open(path, encoding="utf-8") as f:
            layers.append(parse_entries(f.read(), path))
    files = build_image(args.ref, layers, json.loads(args.config), args.epoch)
    with open(args.out, "wb") as f:
        f.write(layout_tar(files, args.epoch))
    print(json.dumps(summary(args.ref, files)))


if __name__ == "__main__":
    sys.exit(main())

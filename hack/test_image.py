"""Tests for hack/image/oci.py and hack/image/rootfs.py on small synthetic files (no Rust, Go or network).

Run from the repository root: python3 -m unittest discover -s hack -p 'test_*.py' -v
"""

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "image"))
import oci  # noqa: E402
import rootfs  # noqa: E402

EPOCH = 1_700_000_000
REF = "localhost/thing:1.2.3"
CONFIG = {"User": "65532:65532", "Entrypoint": ["/bin/thing"], "Cmd": ["run"],
          "Labels": {"org.opencontainers.image.version": "1.2.3", "org.opencontainers.image.title": "thing"}}


class Fixture:
    """Host files for two layers, in a temporary directory that the test cleans up."""

    def __init__(self, test, binary=b"\x7fELF binary", mtime=1_234_567):
        self.dir = tempfile.TemporaryDirectory()
        test.addCleanup(self.dir.cleanup)
        self.binary = self.write("thing", binary, 0o700, mtime)
        self.passwd = self.write("passwd", b"nonroot:x:65532:65532::/:/sbin/nologin\n", 0o600, mtime)
        self.lib = self.write("libc.so.6", b"libc", 0o644, mtime)
        self.layers = [
            oci.parse_entries(f"file /bin/thing 0755 {self.binary}\nfile /etc/passwd 0644 {self.passwd}\n"
                              "dir /tmp 1777\n"),
            oci.parse_entries(f"file /lib/x86_64-linux-gnu/libc.so.6 0755 {self.lib}\n"
                              "symlink /lib64 lib/x86_64-linux-gnu\ndir /data 0700:65532:65532\n"),
        ]

    def write(self, name, data, mode, mtime):
        path = os.path.join(self.dir.name, name)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, mode)
        os.utime(path, (mtime, mtime))
        return path

    def build(self, ref=REF, config=CONFIG, epoch=EPOCH):
        return oci.layout_tar(oci.build_image(ref, self.layers, config, epoch), epoch)


def members(tar_bytes):
    """{name: (TarInfo, bytes or None)} of a tar, plus its raw header types in order."""
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        return {m.name: (m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()}


def blob(files, digest):
    algorithm, hex_digest = digest.split(":")
    return files[f"blobs/{algorithm}/{hex_digest}"][1]


class LayoutTest(unittest.TestCase):
    def setUp(self):
        self.fixture = Fixture(self)
        self.tar = self.fixture.build()
        self.files = members(self.tar)

    def follow(self):
        """index → manifest → config and layers, checking each descriptor against its blob on the way."""
        index = json.loads(self.files["index.json"][1])
        self.assertEqual(index["schemaVersion"], 2)
        self.assertEqual(index["mediaType"], oci.MEDIA_INDEX)
        self.assertEqual(len(index["manifests"]), 1)
        manifest_desc = index["manifests"][0]
        self.check_descriptor(manifest_desc, oci.MEDIA_MANIFEST)
        manifest = json.loads(blob(self.files, manifest_desc["digest"]))
        self.check_descriptor(manifest["config"], oci.MEDIA_CONFIG)
        for layer in manifest["layers"]:
            self.check_descriptor(layer, oci.MEDIA_LAYER)
        config = json.loads(blob(self.files, manifest["config"]["digest"]))
        return index, manifest, config

    def check_descriptor(self, desc, media_type):
        data = blob(self.files, desc["digest"])
        self.assertEqual(desc["mediaType"], media_type)
        self.assertEqual(desc["size"], len(data), desc)
        self.assertEqual(desc["digest"], "sha256:" + hashlib.sha256(data).hexdigest())

    def layer(self, i):
        _, manifest, _ = self.follow()
        return members(gzip.decompress(blob(self.files, manifest["layers"][i]["digest"])))

    def test_layout_files_and_oci_layout_version(self):
        index, manifest, config = self.follow()
        referenced = {index["manifests"][0]["digest"], manifest["config"]["digest"]}
        referenced |= {layer["digest"] for layer in manifest["layers"]}
        expected = {"oci-layout", "index.json", "blobs", "blobs/sha256"}
        expected |= {"blobs/sha256/" + d.split(":")[1] for d in referenced}
        self.assertEqual(set(self.files), expected)
        self.assertEqual(json.loads(self.files["oci-layout"][1]), {"imageLayoutVersion": "1.0.0"})

    def test_index_names_the_image_for_containerd(self):
        index, _, _ = self.follow()
        desc = index["manifests"][0]
        self.assertEqual(desc["annotations"][oci.ANNOTATION_CONTAINERD_NAME], REF)
        self.assertEqual(desc["annotations"][oci.ANNOTATION_REF_NAME], "1.2.3")
        self.assertEqual(desc["platform"], {"architecture": "amd64", "os": "linux"})

    def test_config_keeps_user_entrypoint_labels_and_diff_ids(self):
        _, manifest, config = self.follow()
        self.assertEqual(config["config"], CONFIG)
        self.assertEqual(config["config"]["User"], "65532:65532")
        self.assertEqual((config["os"], config["architecture"]), ("linux", "amd64"))
        self.assertEqual(config["created"], "2023-11-14T22:13:20Z")
        diff_ids = ["sha256:" + hashlib.sha256(gzip.decompress(blob(self.files, layer["digest"]))).hexdigest()
                    for layer in manifest["layers"]]
        self.assertEqual(config["rootfs"], {"type": "layers", "diff_ids": diff_ids})

    def test_layers_hold_only_listed_entries_and_their_parents(self):
        self.assertEqual(list(self.layer(0)), ["bin", "bin/thing", "etc", "etc/passwd", "tmp"])
        self.assertEqual(list(self.layer(1)), ["data", "lib", "lib/x86_64-linux-gnu",
                                               "lib/x86_64-linux-gnu/libc.so.6", "lib64"])

    def test_layer_entries_have_fixed_modes_owners_and_times(self):
        first, second = self.layer(0), self.layer(1)
        thing, data = first["bin/thing"]
        self.assertEqual(data, b"\x7fELF binary")
        self.assertEqual((thing.mode, thing.uid, thing.gid, thing.uname, thing.gname), (0o755, 0, 0, "", ""))
        self.assertEqual(first["etc/passwd"][0].mode, 0o644)  # the host file is 0600
        self.assertEqual(first["tmp"][0].mode, 0o1777)
        self.assertEqual(first["bin"][0].mode, 0o755)
        self.assertEqual((second["data"][0].uid, second["data"][0].gid, second["data"][0].mode), (65532, 65532, 0o700))
        self.assertEqual(second["lib64"][0].linkname, "lib/x86_64-linux-gnu")
        for name, (info, _) in {**first, **second, **self.files}.items():
            self.assertEqual(info.mtime, EPOCH, name)
            self.assertFalse(info.pax_headers, name)

    def test_gzip_header_has_no_name_and_no_time(self):
        _, manifest, _ = self.follow()
        packed = blob(self.files, manifest["layers"][0]["digest"])
        self.assertEqual(packed[3], 0, "FLG: no FNAME, no FEXTRA, no FCOMMENT")
        self.assertEqual(packed[4:8], b"\0\0\0\0", "MTIME is zero")

    def test_same_input_same_bytes_whatever_the_host_mtimes(self):
        again = Fixture(self, mtime=999)  # other directory, other host mtimes
        self.assertEqual(hashlib.sha256(again.build()).hexdigest(), hashlib.sha256(self.tar).hexdigest())

    def test_any_input_change_changes_the_digest(self):
        def digest(tar_bytes):
            return json.loads(members(tar_bytes)["index.json"][1])["manifests"][0]["digest"]

        base = digest(self.tar)
        self.assertNotEqual(digest(Fixture(self, binary=b"\x7fELF other").build()), base)
        self.assertNotEqual(digest(self.fixture.build(epoch=EPOCH + 1)), base)
        self.assertNotEqual(digest(self.fixture.build(config={**CONFIG, "User": "0:0"})), base)
        self.assertEqual(digest(self.fixture.build(ref="localhost/other:1.2.3")), base)  # the name is not content

    def test_summary_reports_digest_and_sizes(self):
        files = oci.build_image(REF, self.fixture.layers, CONFIG, EPOCH)
        report = oci.summary(REF, files)
        _, manifest, _ = self.follow()
        self.assertEqual(report["digest"], json.loads(files["index.json"])["manifests"][0]["digest"])
        self.assertEqual(report["compressed_bytes"], sum(layer["size"] for layer in manifest["layers"]))
        self.assertEqual(report["uncompressed_bytes"],
                         sum(len(gzip.decompress(blob(self.files, layer["digest"]))) for layer in manifest["layers"]))

    def test_command_line_writes_the_same_tar(self):
        layer_file = os.path.join(self.fixture.dir.name, "layer.txt")
        with open(layer_file, "w") as f:
            f.write(f"# a comment\n\nfile /bin/thing 0755 {self.fixture.binary}\n")
        out = os.path.join(self.fixture.dir.name, "out.tar")
        args = ["--ref", REF, "--layer", layer_file, "--config", json.dumps(CONFIG), "--epoch", str(EPOCH),
                "--out", out]
        report = subprocess.run([sys.executable, os.path.join(HERE, "image", "oci.py"), *args],
                                check=True, capture_output=True, text=True).stdout
        with open(out, "rb") as f:
            written = f.read()
        layers = [oci.parse_entries(f"file /bin/thing 0755 {self.fixture.binary}")]
        self.assertEqual(written, oci.layout_tar(oci.build_image(REF, layers, CONFIG, EPOCH), EPOCH))
        self.assertEqual(json.loads(report)["ref"], REF)


class EntryTest(unittest.TestCase):
    def test_bad_lines_and_paths_are_refused(self):
        for text in ["file /x 0755", "fifo /x 0644", "dir /x"]:
            with self.assertRaisesRegex(ValueError, "layer>:1"):
                oci.parse_entries(text)
        for dest in ["relative", "/a/../b", "/a/", "/"]:
            with self.assertRaises(ValueError):
                oci.layer_tar([oci.Entry("dir", dest)], EPOCH)
        with self.assertRaisesRegex(ValueError, "two entries"):
            oci.layer_tar([oci.Entry("dir", "/a"), oci.Entry("dir", "/a")], EPOCH)
        with self.assertRaisesRegex(ValueError, "tag"):
            oci.split_ref("localhost:5000/thing")


class RootfsTest(unittest.TestCase):
    def test_parse_ldd_keeps_libraries_and_loader(self):
        text = ("\tlinux-vdso.so.1 (0x00007ffd1c1f0000)\n"
                "\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f5e0a000000)\n"
                "\tlibpython3.11.so.1.0 => /opt/py/lib/libpython3.11.so.1.0 (0x00007f5e09000000)\n"
                "\t/lib64/ld-linux-x86-64.so.2 (0x00007f5e0b000000)\n")
        paths = rootfs.parse_ldd(text)
        self.assertEqual(paths, ["/lib/x86_64-linux-gnu/libgcc_s.so.1", "/opt/py/lib/libpython3.11.so.1.0",
                                 "/lib64/ld-linux-x86-64.so.2"])
        self.assertEqual([rootfs.image_lib_path(p) for p in paths],
                         ["/lib/x86_64-linux-gnu/libgcc_s.so.1", "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
                          "/lib64/ld-linux-x86-64.so.2"])
        with self.assertRaisesRegex(ValueError, "missing"):
            rootfs.parse_ldd("\tlibfoo.so => not found\n")

    def test_users_name_root_and_nonroot(self):
        passwd, group = rootfs.users_text()
        self.assertIn("nonroot:x:65532:65532:", passwd)
        self.assertIn("nonroot:x:65532:", group)
        for line in passwd.splitlines():
            self.assertEqual(len(line.split(":")), 7, line)


if __name__ == "__main__":
    unittest.main()

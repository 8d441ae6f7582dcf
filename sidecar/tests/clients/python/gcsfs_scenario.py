"""gcsfs (fsspec's GCS filesystem: its own aiohttp JSON API client, not
google-cloud-storage) runs a fixed list of filesystem operations against an
endpoint and prints their outcomes as one JSON document on stdout.

Usage: gcsfs_scenario.py ENDPOINT BUCKET_A BUCKET_B FORBIDDEN PHYSICAL_A

The outcomes keep only what does not change from run to run (names, sizes,
bytes, checksums, metadata, error types; no times or generations) and write
the endpoint as "{endpoint}", so that a run through bucketmap-sidecar and a
run straight against the emulator can be compared step by step. `steps` is
compared; `own` holds what differs by design (the bucket listing, another
environment's bucket, BUCKET_A's physical name); `final` is what the buckets hold at the end.
"""

import hashlib
import json
import os
import random
import sys

endpoint, bucket_a, bucket_b, forbidden, physical_a = sys.argv[1:6]
os.environ["STORAGE_EMULATOR_HOST"] = endpoint
# gcsfs's bucket-type lookup speaks TLS gRPC to the endpoint; an emulator or
# the sidecar's plaintext port cannot answer it (the injected pods set this too).
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

import gcsfs  # noqa: E402

KEPT = ("name", "size", "type", "bucket", "contentType", "metadata", "crc32c", "md5Hash", "kind")
MIB = 1024 * 1024


def norm(value):
    """What of a result is the same in every run."""
    if isinstance(value, dict):
        return {k: norm(v) for k, v in sorted(value.items()) if k in KEPT}
    if isinstance(value, (list, tuple)):
        return [norm(v) for v in value]
    if isinstance(value, bytes):
        return {"bytes": len(value), "sha256": hashlib.sha256(value).hexdigest()[:16]}
    if isinstance(value, str):
        return value.replace(endpoint, "{endpoint}")
    return value


def run(record, name, action):
    try:
        record.append({"step": name, "ok": True, "value": norm(action())})
    except Exception as e:  # the outcome is the error's type
        record.append({"step": name, "ok": False, "error": type(e).__name__})


def write_big(fs, path, data):
    with fs.open(path, "wb", block_size=5 * MIB) as f:
        for i in range(0, len(data), MIB):
            f.write(data[i : i + MIB])


def read_at(fs, path, offset, length):
    with fs.open(path, "rb", block_size=2 * MIB) as f:
        f.seek(offset)
        return f.read(length)


def main():
    fs = gcsfs.GCSFileSystem(project="bucketmap-test", token="anon")
    a, b = bucket_a, bucket_b
    big = random.Random(7).randbytes(12 * MIB + 4321)
    steps = []
    run(steps, "pipe", lambda: fs.pipe(f"{a}/dir/one.txt", b"hello") and None)
    run(steps, "cat", lambda: fs.cat(f"{a}/dir/one.txt"))
    run(steps, "write_resumable", lambda: write_big(fs, f"{a}/dir/big.bin", big))
    run(steps, "cat_big", lambda: fs.cat(f"{a}/dir/big.bin"))
    run(steps, "info", lambda: fs.info(f"{a}/dir/big.bin"))
    run(steps, "read_at", lambda: read_at(fs, f"{a}/dir/big.bin", 5 * MIB - 3, 100))
    run(steps, "cat_ranges", lambda: fs.cat_ranges([f"{a}/dir/big.bin"] * 2, [0, 9 * MIB], [10, 9 * MIB + 10]))
    run(steps, "pipe_many", lambda: fs.pipe({f"{a}/many/{i}.txt": str(i).encode() for i in range(5)}) and None)
    run(steps, "touch", lambda: fs.touch(f"{a}/empty"))
    run(steps, "ls", lambda: sorted(fs.ls(f"{a}/dir")))
    run(steps, "ls_detail", lambda: sorted(fs.ls(a, detail=True), key=lambda d: d["name"]))
    run(steps, "find", lambda: fs.find(a))
    run(steps, "walk", lambda: [(p, sorted(d), sorted(f)) for p, d, f in fs.walk(a)])
    run(steps, "glob", lambda: fs.glob(f"{a}/many/*.txt"))
    run(steps, "exists", lambda: [fs.exists(f"{a}/dir/one.txt"), fs.exists(f"{a}/dir/nope")])
    run(steps, "du", lambda: fs.du(a))
    run(steps, "copy_across", lambda: fs.copy(f"{a}/dir/one.txt", f"{b}/in/one.txt"))
    run(steps, "cat_copied", lambda: fs.cat(f"{b}/in/one.txt"))
    run(steps, "copy_recursive", lambda: fs.copy(f"{a}/many", f"{b}/many", recursive=True))
    run(steps, "mv", lambda: fs.mv(f"{a}/dir/one.txt", f"{a}/dir/two.txt"))
    run(steps, "moved", lambda: [fs.exists(f"{a}/dir/one.txt"), fs.cat(f"{a}/dir/two.txt")])
    run(steps, "setxattrs", lambda: fs.setxattrs(f"{a}/dir/two.txt", color="red"))
    run(steps, "getxattr", lambda: fs.getxattr(f"{a}/dir/two.txt", "color"))
    run(steps, "merge", lambda: fs.merge(f"{a}/merged", [f"{a}/dir/two.txt", f"{a}/many/1.txt"]))
    run(steps, "cat_merged", lambda: fs.cat(f"{a}/merged"))
    run(steps, "bucket_info", lambda: fs.info(a))
    run(steps, "rm_many", lambda: fs.rm([f"{a}/many/0.txt", f"{a}/many/2.txt"]))
    run(steps, "rm_recursive", lambda: fs.rm(f"{b}/many", recursive=True))
    run(steps, "missing_object", lambda: fs.cat(f"{a}/nope"))
    run(steps, "missing_bucket", lambda: fs.ls("bucketmap-no-such-bucket"))
    own = []
    fs.invalidate_cache()
    run(own, "buckets", lambda: sorted(fs.ls("")))
    run(own, "forbidden", lambda: fs.ls(forbidden))
    run(own, "physical", lambda: fs.ls(physical_a))
    fs.invalidate_cache()
    final = {bucket: fs.find(bucket) for bucket in (a, b)}
    print(json.dumps({"steps": steps, "own": own, "final": final}, indent=1))


main()

"""Drive the sidecar with the real Python client (google-cloud-storage).

Usage: STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT python scenario.py SPEC.json

SPEC.json is written by the Rust integration test (sidecar/tests/integration/common): the
logical bucket names, the files to upload and every object name. This program
only observes: it runs each step, records what the library returned (raw JSON
resources, digests of downloaded bytes, error codes), and prints one JSON
report on stdout. The Rust test decides what is right. A failing step is
recorded and the scenario goes on, so one report shows every failure.
"""

import hashlib
import itertools
import json
import os
import sys
import traceback

import requests
from google.api_core import exceptions as api_exceptions
from google.cloud import storage


def digest(data):
    return {"len": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def resource(blob_or_bucket):
    """The raw JSON resource the library received, as the server sent it."""
    return dict(blob_or_bucket._properties)


def error_of(exc):
    out = {"type": type(exc).__name__, "message": str(exc)}
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        out["code"] = code
    return out


class Scenario:
    def __init__(self, spec):
        self.spec = spec
        self.steps = {}
        self.client = storage.Client()
        self.photos = self.client.bucket(spec["buckets"]["photos"])
        self.videos = self.client.bucket(spec["buckets"]["videos"])
        self.objects = spec["objects"]

    def step(self, name, fn):
        try:
            result = fn() or {}
            result["ok"] = True
        except Exception as exc:  # noqa: BLE001 - every failure goes in the report
            result = {"ok": False, "error": error_of(exc), "traceback": traceback.format_exc()}
        self.steps[name] = result

    # --- steps -----------------------------------------------------------------

    def get_bucket(self):
        bucket = self.client.get_bucket(self.spec["buckets"]["photos"])
        return {"resource": resource(bucket)}

    def small_upload(self):
        blob = self.photos.blob(self.objects["small"])
        blob.upload_from_filename(self.spec["small_file"], content_type="text/plain")
        return {"resource": resource(blob)}

    def large_upload(self):
        blob = self.photos.blob(self.objects["large"], chunk_size=self.spec["chunk_size"])
        blob.upload_from_filename(self.spec["large_file"], content_type="application/octet-stream")
        return {"resource": resource(blob)}

    def resumable_session(self):
        """The session URL is handed to another HTTP client (as apps do with browsers)."""
        with open(self.spec["small_file"], "rb") as f:
            data = f.read()
        blob = self.photos.blob(self.objects["session"])
        url = blob.create_resumable_upload_session(content_type="text/plain", size=len(data))
        resp = requests.put(url, data=data, timeout=60)
        return {
            "session_url": url,
            "put_status": resp.status_code,
            "resource": resp.json() if resp.headers.get("content-type", "").startswith("application/json") else None,
        }

    def tree_upload(self):
        out = []
        for obj in self.spec["tree"]:
            blob = self.photos.blob(obj["name"])
            blob.upload_from_string(obj["content"].encode(), content_type="text/plain")
            out.append(resource(blob))
        return {"resources": out}

    def download_full(self):
        # A fresh blob: the library builds the download URL itself.
        fresh = self.photos.blob(self.objects["large"]).download_as_bytes()
        # A loaded blob: the library downloads from the mediaLink the server gave.
        loaded = self.photos.get_blob(self.objects["large"])
        via_media_link = loaded.download_as_bytes()
        small = self.photos.blob(self.objects["small"]).download_as_bytes()
        return {
            "large": digest(fresh),
            "large_via_media_link": digest(via_media_link),
            "media_link_used": loaded.media_link,
            "small": digest(small),
        }

    def download_range(self):
        start = self.spec["range"]["start"]
        length = self.spec["range"]["length"]
        data = self.photos.blob(self.objects["large"]).download_as_bytes(start=start, end=start + length - 1)
        return {"range": digest(data)}

    def list_delimited(self):
        it = self.client.list_blobs(self.photos, prefix=self.spec["list_prefix"], delimiter="/")
        items = [resource(b) for b in it]
        return {"items": items, "prefixes": sorted(it.prefixes)}

    def list_prefix(self):
        items = [resource(b) for b in self.client.list_blobs(self.photos, prefix=self.spec["list_prefix"])]
        return {"items": items}

    def copy(self):
        src = self.photos.blob(self.objects["small"])
        copied = self.photos.copy_blob(src, self.videos, self.objects["copy"])
        data = self.videos.blob(self.objects["copy"]).download_as_bytes()
        return {"resource": resource(copied), "content": digest(data)}

    def rewrite(self):
        src = self.photos.blob(self.objects["large"])
        dst = self.videos.blob(self.objects["rewrite"])
        token, calls = None, 0
        while True:
            token, _, _ = dst.rewrite(src, token=token)
            calls += 1
            if token is None:
                break
        data = self.videos.blob(self.objects["rewrite"]).download_as_bytes()
        return {"resource": resource(dst), "calls": calls, "content": digest(data)}

    def compose(self):
        compose = self.spec["compose"]
        dst = self.photos.blob(compose["destination"])
        dst.content_type = "text/plain"
        dst.compose([self.photos.blob(name) for name in compose["sources"]])
        data = self.photos.blob(compose["destination"]).download_as_bytes()
        return {"resource": resource(dst), "content": digest(data)}

    def metadata_patch(self):
        blob = self.photos.get_blob(self.objects["small"])
        blob.metadata = self.spec["metadata"]
        blob.patch()
        patched = resource(blob)
        reloaded = self.photos.get_blob(self.objects["small"])
        return {"resource": patched, "reloaded": resource(reloaded)}

    def delete(self):
        name = self.spec["compose"]["destination"]
        self.photos.delete_blob(name)
        return {"exists_after": self.photos.blob(name).exists()}

    def not_found(self):
        try:
            self.photos.blob(self.objects["missing"]).reload()
        except api_exceptions.GoogleAPICallError as exc:
            return {"error": error_of(exc)}
        return {"error": None}

    def batch_delete(self):
        batch = self.spec["batch"]
        for name in batch["delete"]:
            self.photos.blob(name).upload_from_string(name.encode(), content_type="text/plain")
        before = sorted(b.name for b in self.client.list_blobs(self.photos, prefix=batch["prefix"]))
        with self.client.batch(raise_exception=True):
            for name in batch["delete"]:
                self.photos.delete_blob(name)
        after = sorted(b.name for b in self.client.list_blobs(self.photos, prefix=batch["prefix"]))
        return {"before": before, "after": after}

    def run(self):
        self.step("get_bucket", self.get_bucket)
        self.step("small_upload", self.small_upload)
        self.step("large_upload", self.large_upload)
        self.step("resumable_session", self.resumable_session)
        self.step("tree_upload", self.tree_upload)
        self.step("download_full", self.download_full)
        self.step("download_range", self.download_range)
        self.step("list_delimited", self.list_delimited)
        self.step("list_prefix", self.list_prefix)
        self.step("copy", self.copy)
        self.step("rewrite", self.rewrite)
        self.step("compose", self.compose)
        self.step("metadata_patch", self.metadata_patch)
        self.step("delete", self.delete)
        self.step("not_found", self.not_found)
        self.step("batch_delete", self.batch_delete)


def add_content_ids_to_batch_parts():
    """Give each batch part a Content-ID header, as the Go, Java and Node clients do.

    google-cloud-storage sends its `application/http` parts without one; GCS
    accepts that, but fake-gcs-server (the upstream in these tests) silently
    skips such parts and answers an empty multipart body. Everything else in
    the batch request (absolute request URLs, framing, nested headers) stays
    exactly what the library sends.
    """
    from google.cloud.storage import batch as batch_module

    counter = itertools.count(1)

    class PartWithContentId(batch_module.MIMEApplicationHTTP):
        def __init__(self, *args):
            super().__init__(*args)
            self["Content-ID"] = f"<part+{next(counter)}>"

    batch_module.MIMEApplicationHTTP = PartWithContentId


def main():
    add_content_ids_to_batch_parts()
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    scenario = Scenario(spec)
    scenario.run()
    report = {
        "client": "python",
        "library": "google-cloud-storage " + storage.__version__,
        "emulator_host": os.environ.get("STORAGE_EMULATOR_HOST"),
        "steps": scenario.steps,
    }
    json.dump(report, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

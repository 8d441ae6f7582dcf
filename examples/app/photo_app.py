"""An unmodified application: it only knows the logical bucket name.

Run with STORAGE_EMULATOR_HOST pointing at bucketmap-sidecar; `bucketmap dev`
does this and then finds the object in the physical bucket.
"""
import sys

from google.cloud import storage

bucket_name = sys.argv[1] if len(sys.argv) > 1 else "photos"
client = storage.Client(project="bucketmap-dev")
blob = client.bucket(bucket_name).blob("hello.txt")
blob.upload_from_string("hello from an app that only says " + bucket_name)
names = [b.name for b in client.list_blobs(bucket_name)]
print(f"wrote gs://{blob.bucket.name}/hello.txt; {bucket_name} holds {names}")

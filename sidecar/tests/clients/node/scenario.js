// Drive the sidecar with the real Node.js client (@google-cloud/storage).
//
// Usage: BUCKETMAP_TEST_ENDPOINT=http://127.0.0.1:PORT node scenario.js SPEC.json
//
// How the library is pointed at a custom endpoint: it reads
// STORAGE_EMULATOR_HOST raw as the JSON API base URL (it must then end in
// /storage/v1) but also derives the upload URL from it
// (`${STORAGE_EMULATOR_HOST}/upload/storage/v1/...`), so no single value of
// that variable serves both. The `apiEndpoint` option (the documented way)
// gives consistent URLs, so the main client uses it; the
// `env_only_client` step checks that the STORAGE_EMULATOR_HOST route still
// works for JSON API calls.
//
// SPEC.json is written by the Rust integration test (sidecar/tests/integration/common).
// This program only observes: it records what the library returned (raw JSON
// resources, digests of downloaded bytes, errors) and prints one JSON report
// on stdout. The Rust test decides what is right.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const {Storage} = require('@google-cloud/storage');

function digest(data) {
  return {len: data.length, sha256: crypto.createHash('sha256').update(data).digest('hex')};
}

function errorOf(err) {
  const out = {type: (err && err.constructor && err.constructor.name) || typeof err, message: String(err && err.message)};
  if (err && typeof err.code === 'number') out.code = err.code;
  return out;
}

async function main() {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const endpoint = process.env.BUCKETMAP_TEST_ENDPOINT;
  if (!endpoint) throw new Error('BUCKETMAP_TEST_ENDPOINT is not set');
  delete process.env.STORAGE_EMULATOR_HOST;

  const storage = new Storage({apiEndpoint: endpoint, projectId: 'bucketmap-test'});
  const photos = storage.bucket(spec.buckets.photos);
  const videos = storage.bucket(spec.buckets.videos);
  const o = spec.objects;
  const steps = {};

  async function step(name, fn) {
    let out;
    try {
      out = (await fn()) || {};
      out.ok = true;
    } catch (err) {
      out = {ok: false, error: errorOf(err), stack: String(err && err.stack)};
    }
    steps[name] = out;
  }

  async function download(file, options) {
    const [data] = await file.download(options || {});
    return data;
  }

  await step('get_bucket', async () => {
    const [metadata] = await photos.getMetadata();
    return {resource: metadata};
  });

  await step('small_upload', async () => {
    const file = photos.file(o.small);
    await file.save(fs.readFileSync(spec.small_file), {resumable: false, contentType: 'text/plain'});
    return {resource: file.metadata};
  });

  await step('large_upload', async () => {
    const [file] = await photos.upload(spec.large_file, {
      destination: o.large,
      resumable: true,
      chunkSize: spec.chunk_size,
      contentType: 'application/octet-stream',
    });
    return {resource: file.metadata};
  });

  await step('resumable_session', async () => {
    // The session URL is handed to another HTTP client (as apps do with browsers).
    const data = fs.readFileSync(spec.small_file);
    const [url] = await photos.file(o.session).createResumableUpload({metadata: {contentType: 'text/plain'}});
    const resp = await fetch(url, {method: 'PUT', body: data});
    const text = await resp.text();
    let resource = null;
    try {
      resource = JSON.parse(text);
    } catch (_) {
      resource = null;
    }
    return {session_url: url, put_status: resp.status, resource};
  });

  await step('tree_upload', async () => {
    const resources = [];
    for (const t of spec.tree) {
      const file = photos.file(t.name);
      await file.save(Buffer.from(t.content, 'utf8'), {resumable: false, contentType: 'text/plain'});
      resources.push(file.metadata);
    }
    return {resources};
  });

  await step('download_full', async () => {
    const large = await download(photos.file(o.large));
    const small = await download(photos.file(o.small));
    return {large: digest(large), small: digest(small)};
  });

  await step('download_range', async () => {
    const start = spec.range.start;
    const end = start + spec.range.length - 1; // inclusive
    return {range: digest(await download(photos.file(o.large), {start, end}))};
  });

  async function list(query) {
    const items = [];
    const prefixes = [];
    let q = Object.assign({autoPaginate: false}, query);
    while (q) {
      const [files, next, apiResponse] = await photos.getFiles(q);
      for (const f of files) items.push(f.metadata);
      for (const p of (apiResponse && apiResponse.prefixes) || []) prefixes.push(p);
      q = next;
    }
    prefixes.sort();
    return {items, prefixes};
  }
  await step('list_delimited', () => list({prefix: spec.list_prefix, delimiter: '/'}));
  await step('list_prefix', async () => {
    const out = await list({prefix: spec.list_prefix});
    delete out.prefixes;
    return out;
  });

  // file.copy() uses rewriteTo, looping on the rewrite token.
  const copyStep = (src, dst) => async () => {
    const [copied, apiResponse] = await photos.file(src).copy(videos.file(dst));
    const data = await download(videos.file(dst));
    return {
      resource: (apiResponse && apiResponse.resource) || copied.metadata,
      content: digest(data),
    };
  };
  await step('copy', copyStep(o.small, o.copy));
  await step('rewrite', copyStep(o.large, o.rewrite));

  await step('compose', async () => {
    const dst = photos.file(spec.compose.destination);
    const [combined, apiResponse] = await photos.combine(
      spec.compose.sources.map(n => photos.file(n)),
      dst,
      {contentType: 'text/plain'}
    );
    const data = await download(photos.file(spec.compose.destination));
    return {resource: apiResponse || combined.metadata, content: digest(data)};
  });

  await step('metadata_patch', async () => {
    const file = photos.file(o.small);
    const [patched] = await file.setMetadata({metadata: spec.metadata});
    const [reloaded] = await photos.file(o.small).getMetadata();
    return {resource: patched, reloaded};
  });

  await step('delete', async () => {
    const file = photos.file(spec.compose.destination);
    await file.delete();
    const [exists] = await photos.file(spec.compose.destination).exists();
    return {exists_after: exists};
  });

  await step('not_found', async () => {
    try {
      await photos.file(o.missing).getMetadata();
      return {error: null};
    } catch (err) {
      return {error: errorOf(err)};
    }
  });

  await step('env_only_client', async () => {
    process.env.STORAGE_EMULATOR_HOST = `${endpoint}/storage/v1`;
    try {
      const envStorage = new Storage({projectId: 'bucketmap-test'});
      const [metadata] = await envStorage.bucket(spec.buckets.photos).file(o.small).getMetadata();
      return {resource: metadata};
    } finally {
      delete process.env.STORAGE_EMULATOR_HOST;
    }
  });

  // The package's `exports` hide package.json; find it from the entry point.
  let dir = path.dirname(require.resolve('@google-cloud/storage'));
  while (!fs.existsSync(path.join(dir, 'package.json')) || path.basename(dir) !== 'storage') dir = path.dirname(dir);
  const pkg = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8'));
  const report = {
    client: 'node',
    library: `${pkg.name} ${pkg.version}`,
    emulator_host: endpoint,
    steps,
  };
  process.stdout.write(JSON.stringify(report, null, 1) + '\n');
}

main().catch(err => {
  process.stderr.write(`scenario failed: ${err && err.stack}\n`);
  process.exit(1);
});

// Tests of the addon at the JSON-text seam, run with `node --test test/`
// after `npm run build`. The harness's contract suites cover the hooks'
// semantics; these cover what they do not: lone UTF-16 surrogates, numbers
// JSON.parse reads as Infinity, the torn-tail marker's life, handles sharing a store, the store options, a
// moment out of file descriptors, and
// the typed error a second process gets.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

const require = createRequire(import.meta.url)
const addonPath = join(import.meta.dirname, '..', 'index.js')
const addon = require(addonPath)

function tempRoot(t) {
  const root = mkdtempSync(join(tmpdir(), 'sessionlog-node-test-'))
  t.after(() => rmSync(root, { recursive: true, force: true }))
  return root
}

const meta = id => ({ version: 0, id, createdAt: 1000, cwd: '/w' })

test('strings with lone UTF-16 surrogates round-trip exactly', async (t) => {
  const root = tempRoot(t)
  // Lone lead and trail surrogates, a valid pair, and a lone surrogate in a
  // key: JSON.stringify escapes the lone ones as \ud800-style ASCII, which a
  // Rust String (and so serde_json::Value) cannot hold.
  const odd = 'a\ud800b\udfff😀\udbff'
  const events = [
    { type: 'turn/start', seq: 0, time: 1, data: { turn: 1, note: odd } },
    { type: 'plugin/probe', seq: 1, time: 2, data: { [odd]: [odd, { deep: odd }] }, ignorable: true },
  ]
  const store = addon.openSessionLog(root)
  await store.appendBatch(JSON.stringify(meta('s')), JSON.stringify(events), false)
  const check = async (handle, label) => {
    const loaded = JSON.parse(await handle.loadStored('s'))
    assert.deepEqual(loaded.events, events, label)
    assert.equal(loaded.events[0].data.note, odd, `${label}: the string itself`)
    assert.equal(JSON.stringify(loaded.events), JSON.stringify(events), `${label}: the text`)
    const suffix = JSON.parse(await handle.loadStoredFrom('s', 1))
    assert.deepEqual(suffix.events, events.slice(1), `${label}: seek read`)
  }
  await check(store, 'same handle')
  await store.close()
  // From disk, in a new store instance.
  const reopened = addon.openSessionLog(root)
  await check(reopened, 'after reopen')
  await reopened.close()
})

/** Reads a session through the streaming reader: [head, events, number of chunks]. */
async function readAll(store, id, fromSeq, maxBytes) {
  const reader = store.storedReader(id, fromSeq)
  const head = await reader.open()
  if (head === null) return [null, [], 0]
  const events = []
  let chunks = 0
  for (let text = await reader.next(maxBytes); text !== null; text = await reader.next(maxBytes)) {
    chunks += 1
    events.push(...JSON.parse(text))
  }
  return [JSON.parse(head), events, chunks]
}

test('the streaming reader returns what loadStored and loadStoredFrom return, chunk by chunk', async (t) => {
  const root = tempRoot(t)
  const odd = 'a\ud800b\udfff😀\udbff'
  const store = addon.openSessionLog(root)
  const all = []
  for (let b = 0; b < 40; b++) {
    const batch = []
    for (let i = 0; i < 5; i++) {
      const seq = all.length + batch.length
      batch.push({ type: 'plugin/probe', seq, time: seq, data: { odd, pad: 'x'.repeat(seq % 7 * 100) }, ignorable: true })
    }
    await store.appendBatch(JSON.stringify(meta('s')), JSON.stringify(batch), b > 0)
    all.push(...batch)
  }
  const loaded = JSON.parse(await store.loadStored('s'))
  for (const maxBytes of [1, 2000, 1 << 20]) {
    const [head, events, chunks] = await readAll(store, 's', null, maxBytes)
    assert.deepEqual(head, { meta: loaded.meta, revision: loaded.revision }, `head, ${maxBytes}`)
    assert.equal(JSON.stringify(events), JSON.stringify(all), `events, ${maxBytes}`)
    // A chunk holds whole batches: at least one, more while under maxBytes.
    assert.equal(chunks, maxBytes === 1 ? 40 : maxBytes === 2000 ? chunks : 1, `chunks, ${maxBytes}`)
    if (maxBytes === 2000) assert.ok(chunks > 1 && chunks < 40, `${chunks} chunks of ~2000 bytes`)
  }
  for (const from of [0, 1, 7, 199, 200, 500]) {
    const [head, events] = await readAll(store, 's', from, 3000)
    assert.deepEqual(head, { meta: loaded.meta }, `head from ${from}`)
    assert.deepEqual(events, JSON.parse(await store.loadStoredFrom('s', from)).events, `from ${from}`)
    assert.deepEqual(events.map(e => e.seq), all.slice(from).map(e => e.seq), `seqs from ${from}`)
  }
  // A reader reads the session as it was when opened: head and events agree.
  const reader = store.storedReader('s', null)
  const head = JSON.parse(await reader.open())
  await store.appendBatch(JSON.stringify(meta('s')), JSON.stringify([
    { type: 'plugin/probe', seq: 200, time: 200, data: {}, ignorable: true },
  ]), true)
  const events = []
  for (let text = await reader.next(1 << 20); text !== null; text = await reader.next(1 << 20)) {
    events.push(...JSON.parse(text))
  }
  assert.equal(events.length, 200)
  assert.equal(head.revision, loaded.revision)
  assert.notEqual(JSON.parse(await store.loadStored('s')).revision, head.revision)
  assert.equal(await reader.next(1), null, 'a finished reader stays finished')
  await assert.rejects(reader.open(), /SESSIONLOG_BAD_INPUT: .*already opened/)
  assert.deepEqual(await readAll(store, 'absent', null, 1), [null, [], 0])
  assert.deepEqual(await readAll(store, 'absent', 3, 1), [null, [], 0])
  await store.close()
})

test('revisions are stable while a log is unchanged and change on append and repair', async (t) => {
  const root = tempRoot(t)
  const store = addon.openSessionLog(root)
  assert.equal(await store.readStoredRevision('r'), null)
  await store.appendBatch(JSON.stringify(meta('r')), JSON.stringify([
    { type: 'turn/start', seq: 0, time: 1, data: { turn: 1 } },
  ]), false)
  const r1 = await store.readStoredRevision('r')
  assert.equal(await store.readStoredRevision('r'), r1)
  assert.equal(JSON.parse(await store.loadStored('r')).revision, r1)
  assert.equal(JSON.parse(await store.listSnapshots())[0].revision, r1)
  await store.appendBatch(JSON.stringify(meta('r')), JSON.stringify([
    { type: 'step/start', seq: 1, time: 2, data: { turn: 1, step: 1 } },
  ]), true)
  const r2 = await store.readStoredRevision('r')
  assert.notEqual(r2, r1)
  await store.commitRepair(JSON.stringify(meta('r')), null, JSON.stringify([
    { type: 'step/end', seq: 2, time: 3, data: { turn: 1, step: 1 } },
  ]))
  const r3 = await store.readStoredRevision('r')
  assert.notEqual(r3, r2)
  await store.close()
  const reopened = addon.openSessionLog(root)
  assert.equal(await reopened.readStoredRevision('r'), r3, 'stable across reopen')
  await reopened.close()
})

test('a torn tail is reported once as tornMarker, retired by commitRepair, and never truncates committed events', async (t) => {
  const root = tempRoot(t)
  const store = addon.openSessionLog(root)
  const committed = [
    { type: 'turn/start', seq: 0, time: 1, data: { turn: 1 } },
    { type: 'step/start', seq: 1, time: 2, data: { turn: 1, step: 1 } },
  ]
  await store.appendBatch(JSON.stringify(meta('t')), JSON.stringify(committed), false)
  const clean = JSON.parse(await store.loadStored('t'))
  assert.equal(clean.tornMarker, undefined, 'no torn tail before the crash')
  // Corrupting needs every handle on the root closed (an open store would
  // write over the fragment).
  await assert.rejects(addon.corruptTailForTest(root, 't', '/w'), /SESSIONLOG_IN_USE/)
  await store.close()
  await addon.corruptTailForTest(root, 't', '/w')

  const reopened = addon.openSessionLog(root)
  const torn = JSON.parse(await reopened.loadStored('t'))
  assert.equal(typeof torn.tornMarker, 'number', 'the torn tail is reported')
  assert.deepEqual(torn.events, committed, 'committed events survive')
  await assert.rejects(
    reopened.commitRepair(JSON.stringify(meta('t')), torn.tornMarker + 1, '[]'),
    /SESSIONLOG_STALE_REPAIR/,
  )
  const closers = [
    { type: 'step/end', seq: 2, time: 3, data: { turn: 1, step: 1 } },
    { type: 'turn/end', seq: 3, time: 3, data: { turn: 1, reason: { kind: 'interrupted' } } },
  ]
  // A repair the store refuses (a seq gap) changes nothing: the marker is
  // still the torn tail's, and the same repair with the right closers works.
  const gap = closers.map(e => ({ ...e, seq: e.seq + 1 }))
  await assert.rejects(
    reopened.commitRepair(JSON.stringify(meta('t')), torn.tornMarker, JSON.stringify(gap)),
    /SESSIONLOG_REJECTED/,
  )
  assert.equal(JSON.parse(await reopened.loadStored('t')).tornMarker, torn.tornMarker)
  await reopened.commitRepair(JSON.stringify(meta('t')), torn.tornMarker, JSON.stringify(closers))
  const repaired = JSON.parse(await reopened.loadStored('t'))
  assert.equal(repaired.tornMarker, undefined, 'present only while there is a torn tail')
  assert.deepEqual(repaired.events, [...committed, ...closers])
  await reopened.close()

  const again = addon.openSessionLog(root)
  const final = JSON.parse(await again.loadStored('t'))
  assert.equal(final.tornMarker, undefined)
  assert.deepEqual(final.events, [...committed, ...closers])
  await again.close()
})

test('an event with a repeated key is refused whole, naming it', async (t) => {
  const root = tempRoot(t)
  const store = addon.openSessionLog(root)
  await store.appendBatch(JSON.stringify(meta('d')), JSON.stringify([
    { type: 'turn/start', seq: 0, time: 1, data: { turn: 1 } },
  ]), false)
  // JSON.parse keeps the last "seq" (7); a store indexing the first (1)
  // would read back a log whose seqs disagree with its order.
  const text = '[{"type":"step/start","seq":1,"time":2,"data":{"turn":1,"step":1},"seq":7}]'
  await assert.rejects(
    store.appendBatch(JSON.stringify(meta('d')), text, true),
    /SESSIONLOG_BAD_INPUT.*"seq" twice/,
  )
  const loaded = JSON.parse(await store.loadStored('d'))
  assert.deepEqual(loaded.events.map(e => e.seq), [0], 'nothing of the batch stored')
  await store.close()
})

test('two handles on one root in a process share the store', async (t) => {
  const root = tempRoot(t)
  const a = addon.openSessionLog(root)
  const b = addon.openSessionLog(join(root, '.'))
  await a.appendBatch(JSON.stringify(meta('x')), JSON.stringify([{ type: 'turn/start', seq: 0, time: 1, data: { turn: 1 } }]), false)
  await b.appendBatch(JSON.stringify(meta('y')), JSON.stringify([{ type: 'turn/start', seq: 0, time: 1, data: { turn: 1 } }]), false)
  assert.deepEqual(JSON.parse(await a.list()).map(h => h.id).sort(), ['x', 'y'])
  await a.close()
  // b still works after a closed.
  assert.equal(JSON.parse(await b.loadStored('x')).events.length, 1)
  await b.close()
  await assert.rejects(b.list(), /SESSIONLOG_CLOSED/)
})

/** The store format version in root's MANIFEST (format-spec.md section 2: a u32 at byte 8). */
const storeVersion = root => readFileSync(join(root, 'MANIFEST')).readUInt32LE(8)

test('openSessionLog options reach the store: compressSealed raises the format, journal keeps a journal', async (t) => {
  const start = [{ type: 'turn/start', seq: 0, time: 1, data: { turn: 1 } }]
  const plainRoot = tempRoot(t)
  const plain = addon.openSessionLog(plainRoot)
  await plain.appendBatch(JSON.stringify(meta('o')), JSON.stringify(start), false)
  assert.equal(storeVersion(plainRoot), 3, 'a store opened without options stays at version 3')
  assert.ok(!existsSync(join(plainRoot, 'journal')) || readdirSync(join(plainRoot, 'journal')).every(n => !n.endsWith('.wal')))
  await plain.close()

  const root = tempRoot(t)
  const store = addon.openSessionLog(root, { compressSealed: true, journal: true })
  await store.appendBatch(JSON.stringify(meta('o')), JSON.stringify(start), false)
  assert.equal(storeVersion(root), 5, 'compressSealed raises the store to the newest version (5) before any image')
  assert.ok(readdirSync(join(root, 'journal')).some(n => n.endsWith('.wal')), 'the journal option keeps a journal file')
  assert.deepEqual(JSON.parse(await store.loadStored('o')).events, start)
  await store.close()
  // Read back by a handle without the options (any build reading version 4 reads images).
  const again = addon.openSessionLog(root)
  assert.deepEqual(JSON.parse(await again.loadStored('o')).events, start)
  await again.close()
})

test('handles on one root in a process must ask for the same options', async (t) => {
  const root = tempRoot(t)
  const a = addon.openSessionLog(root, { journal: true })
  const b = addon.openSessionLog(root)
  const c = addon.openSessionLog(root, { journal: true, compressSealed: false })
  assert.deepEqual(JSON.parse(await a.list()), [])
  await assert.rejects(b.list(),
    /^Error: SESSIONLOG_OPTIONS: the store at .* is already open in this process with options \{ journal: true, compressSealed: false, maxOpenSessions: 512 \}, not \{ journal: false, compressSealed: false, maxOpenSessions: 512 \}/)
  assert.deepEqual(JSON.parse(await c.list()), [], 'absent and false are the same option')
  await a.close()
  await c.close()
  // Once no handle holds the store, other options open it afresh.
  assert.deepEqual(JSON.parse(await b.list()), [])
  await b.close()
})

test('two writers of one session: the stale append is refused, never a seq collision', async (t) => {
  const root = tempRoot(t)
  const a = addon.openSessionLog(root)
  const b = addon.openSessionLog(root)
  const start = [{ type: 'turn/start', seq: 0, time: 1, data: { turn: 1 } }]
  await a.appendBatch(JSON.stringify(meta('w')), JSON.stringify(start), false)
  await assert.rejects(
    b.appendBatch(JSON.stringify(meta('w')), JSON.stringify(start), false),
    /SESSIONLOG_EXISTS/,
  )
  await a.appendBatch(JSON.stringify(meta('w')), JSON.stringify([{ type: 'step/start', seq: 1, time: 2, data: { turn: 1, step: 1 } }]), true)
  // b's view of the session is stale (it believes seq 1 is next).
  await assert.rejects(
    b.appendBatch(JSON.stringify(meta('w')), JSON.stringify([{ type: 'turn/end', seq: 1, time: 3, data: { turn: 1 } }]), true),
    /SESSIONLOG_REJECTED: .*contiguous/,
  )
  assert.deepEqual(JSON.parse(await b.loadStored('w')).events.map(e => e.seq), [0, 1])
  await a.close()
  await b.close()
})

test('a first batch the store refuses leaves the id free and unlisted', async (t) => {
  const root = tempRoot(t)
  const store = addon.openSessionLog(root)
  // Not contiguous from 0: the store refuses the batch.
  await assert.rejects(
    store.appendBatch(JSON.stringify(meta('bad')), JSON.stringify([{ type: 'turn/start', seq: 3, time: 1, data: {} }]), false),
    /SESSIONLOG_REJECTED/,
  )
  assert.equal(await store.loadStored('bad'), null)
  assert.deepEqual(JSON.parse(await store.list()), [])
  await store.appendBatch(JSON.stringify(meta('bad')), JSON.stringify([{ type: 'turn/start', seq: 0, time: 1, data: {} }]), false)
  assert.equal(JSON.parse(await store.loadStored('bad')).events.length, 1)
  await store.close()
})

test('a number JSON.parse reads as Infinity is refused whole, naming the seq', async (t) => {
  const root = tempRoot(t)
  const store = addon.openSessionLog(root)
  // Text JSON.stringify never writes, but a caller of the addon could.
  const batch = '[{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}},' +
    '{"type":"plugin/probe","seq":1,"time":2,"data":{"x":[1,-1E400]},"ignorable":true}]'
  await assert.rejects(
    store.appendBatch(JSON.stringify(meta('inf')), batch, false),
    /SESSIONLOG_BAD_INPUT: event 1 is not plain JSON: number -1E400 is not finite/,
  )
  assert.equal(await store.loadStored('inf'), null, 'nothing of the batch is stored')
  // The same digits in a string are text.
  await store.appendBatch(JSON.stringify(meta('inf')), batch.replace('-1E400', '"-1E400"'), false)
  assert.equal(JSON.parse(await store.loadStored('inf')).events[1].data.x[1], '-1E400')
  await store.close()
})

test('hooks return Promises (disk work runs off the JavaScript thread)', async (t) => {
  const root = tempRoot(t)
  const store = addon.openSessionLog(root)
  const pending = store.list()
  assert.ok(pending instanceof Promise)
  await pending
  await store.close()
})

test('a second process writes its own sessions, and gets a typed SESSIONLOG_LOCKED error for ours', async (t) => {
  const root = tempRoot(t)
  const store = addon.openSessionLog(root)
  await store.appendBatch(JSON.stringify(meta('p')), JSON.stringify([{ type: 'turn/start', seq: 0, time: 1, data: {} }]), false)
  const child = spawnSync(process.execPath, ['-e', `
    const s = require(${JSON.stringify(addonPath)}).openSessionLog(${JSON.stringify(root)})
    const ev = seq => JSON.stringify([{ type: 'turn/start', seq, time: 1, data: {} }])
    const meta = id => JSON.stringify({ version: 0, id, createdAt: 1000, cwd: '/w' })
    s.appendBatch(meta('q'), ev(0), false)
      .then(() => { console.log('own ok'); return s.appendBatch(meta('p'), ev(1), true) })
      .then(() => { console.log('wrote p'); process.exit(0) },
        e => { console.log(e.message); process.exit(3) })
  `], { encoding: 'utf8' })
  assert.equal(child.status, 3, child.stdout + child.stderr)
  assert.match(child.stdout, /^own ok\nSESSIONLOG_LOCKED: /)
  assert.match(child.stdout, /"p"/)
  assert.deepEqual(JSON.parse(await store.list()).map(h => h.id).sort(), ['p', 'q'])
  await store.close()
})

test('a session stays this process\'s while loaded; maxOpenSessions bounds how many', async (t) => {
  // Another process appends seq 1 to session 'own' and prints what happened.
  const tryOwn = root => spawnSync(process.execPath, ['-e', `
    const s = require(${JSON.stringify(addonPath)}).openSessionLog(${JSON.stringify(root)})
    const meta = JSON.stringify({ version: 0, id: 'own', createdAt: 1000, cwd: '/w' })
    s.appendBatch(meta, JSON.stringify([{ type: 'turn/end', seq: 1, time: 2, data: {} }]), true)
      .then(() => { console.log('wrote'); process.exit(0) }, e => { console.log(e.message); process.exit(3) })
  `], { encoding: 'utf8' })
  for (const [max, owned] of [[8, true], [2, false]]) {
    const root = tempRoot(t)
    const store = addon.openSessionLog(root, { maxOpenSessions: max })
    const first = id => store.appendBatch(JSON.stringify(meta(id)), JSON.stringify([{ type: 'turn/start', seq: 0, time: 1, data: {} }]), false)
    await first('own')
    // Four more sessions: past a limit of 2, 'own' (idle) is released.
    for (const id of ['a', 'b', 'c', 'd']) await first(id)
    const child = tryOwn(root)
    if (owned) {
      assert.equal(child.status, 3, child.stdout + child.stderr)
      assert.match(child.stdout, /^SESSIONLOG_LOCKED: /)
    } else {
      assert.equal(child.status, 0, child.stdout + child.stderr)
    }
    await store.close()
  }
})

test('a handle collected without close releases the store for other processes', async (t) => {
  const root = tempRoot(t)
  await (async () => {
    const store = addon.openSessionLog(root)
    await store.appendBatch(JSON.stringify(meta('g')), JSON.stringify([{ type: 'turn/start', seq: 0, time: 1, data: {} }]), false)
  })()
  const v8 = await import('node:v8')
  const vm = await import('node:vm')
  v8.setFlagsFromString('--expose-gc')
  const gc = vm.runInNewContext('gc')
  // Writing 'g' needs its writer lock, which the collected handle held.
  const opens = () => spawnSync(process.execPath, ['-e', `
    const s = require(${JSON.stringify(addonPath)}).openSessionLog(${JSON.stringify(root)})
    const meta = JSON.stringify({ version: 0, id: 'g', createdAt: 1000, cwd: '/w' })
    s.appendBatch(meta, JSON.stringify([{ type: 'turn/end', seq: 1, time: 2, data: {} }]), true)
      .then(() => s.list())
      .then(t => { console.log(t); process.exit(0) }, e => { console.log(e.message); process.exit(3) })
  `], { encoding: 'utf8' })
  // The finalizer runs after a collection, and the close on its own thread
  // after that: poll for a while.
  let child
  for (let i = 0; i < 50; i++) {
    gc()
    await new Promise(resolve => setTimeout(resolve, 20))
    child = opens()
    if (child.status === 0) break
  }
  assert.equal(child.status, 0, child.stdout + child.stderr)
  assert.deepEqual(JSON.parse(child.stdout).map(h => h.id), ['g'])
})

test('a session id with a lone UTF-16 surrogate is refused, never read as another session', async (t) => {
  const root = tempRoot(t)
  const store = addon.openSessionLog(root)
  // napi's String conversion writes a lone surrogate as U+FFFD: 'a\ud800'
  // and 'a\udfff' would both name the stored session 'a\ufffd'.
  await store.appendBatch(JSON.stringify(meta('a\ufffd')), JSON.stringify([{ type: 'turn/start', seq: 0, time: 1, data: {} }]), false)
  for (const id of ['a\ud800', 'a\udfff', '\udc00']) {
    const named = /SESSIONLOG_BAD_ID: session id ".*\\u[dD][89a-fA-F][0-9a-fA-F]{2}.*" holds a lone UTF-16 surrogate/
    await assert.rejects(store.loadStored(id), named, `loadStored(${JSON.stringify(id)})`)
    await assert.rejects(store.readStoredRevision(id), named)
    await assert.rejects(store.loadStoredFrom(id, 0), named)
    await assert.rejects(store.storedReader(id, null).open(), named)
    await assert.rejects(store.storedReader(id, 0).open(), named)
    await assert.rejects(
      store.appendBatch(JSON.stringify(meta(id)), JSON.stringify([{ type: 'turn/start', seq: 0, time: 1, data: {} }]), false),
      /SESSIONLOG_BAD_INPUT: session header "id" holds a lone UTF-16 surrogate/,
    )
    assert.equal(store.locate(JSON.stringify(meta(id))), null)
  }
  // The session with the replacement character itself is intact and alone.
  assert.equal(JSON.parse(await store.loadStored('a\ufffd')).meta.id, 'a\ufffd')
  assert.deepEqual(JSON.parse(await store.list()).map(h => h.id), ['a\ufffd'])
  await store.close()
})

test('a repair that only retires a torn tail changes the revision', async (t) => {
  // The contract: a revision changes after every append or repair. The
  // coordinator keeps prepared sessions by revision: one prepared with the
  // torn marker must not pass as current once the marker was retired.
  const root = tempRoot(t)
  const store = addon.openSessionLog(root)
  await store.appendBatch(JSON.stringify(meta('t')), JSON.stringify([{ type: 'turn/start', seq: 0, time: 1, data: { turn: 1 } }]), false)
  await store.close()
  await addon.corruptTailForTest(root, 't', '/w')
  const reopened = addon.openSessionLog(root)
  const torn = JSON.parse(await reopened.loadStored('t'))
  assert.equal(typeof torn.tornMarker, 'number')
  assert.equal(await reopened.readStoredRevision('t'), torn.revision, 'stable while unchanged')
  assert.equal(JSON.parse(await reopened.loadStored('t')).revision, torn.revision)
  assert.equal(JSON.parse(await reopened.listSnapshots())[0].revision, torn.revision)
  await reopened.commitRepair(JSON.stringify(meta('t')), torn.tornMarker, '[]')
  const repaired = await reopened.readStoredRevision('t')
  assert.notEqual(repaired, torn.revision, 'the repair changed the revision')
  const after = JSON.parse(await reopened.loadStored('t'))
  assert.equal(after.tornMarker, undefined)
  assert.equal(after.revision, repaired)
  assert.equal(JSON.parse(await reopened.listSnapshots())[0].revision, repaired)
  await reopened.close()
  const again = addon.openSessionLog(root)
  assert.equal(await again.readStoredRevision('t'), repaired, 'stable across reopen')
  assert.equal(JSON.parse(await again.loadStored('t')).revision, repaired)
  await again.close()
})

/** Flips a byte of the last record of session `id`'s only segment (the store must be closed). */
function damageLastRecord(store, id) {
  const dir = store.locate(JSON.stringify(meta(id))).path
  const seg = join(dir, readdirSync(dir).find(f => f.endsWith('.seg')))
  const bytes = readFileSync(seg)
  let end = bytes.length
  while (end > 0 && bytes[end - 1] === 0) end--
  bytes[end - 10] ^= 0xff
  writeFileSync(seg, bytes)
}

/** Writes sessions `ids`, two batches each, through `store`. */
async function writeSessions(store, ids) {
  for (const id of ids) {
    await store.appendBatch(JSON.stringify(meta(id)), JSON.stringify([{ type: 'turn/start', seq: 0, time: 1, data: {} }]), false)
    await store.appendBatch(JSON.stringify(meta(id)), JSON.stringify([{ type: 'turn/end', seq: 1, time: 2, data: {} }]), true)
  }
}

test('listSnapshots lists a damaged session among the others, with a revision whose load reports the damage', async (t) => {
  // The harness's JSONL backend lists every session whose header it reads
  // (a damaged log body is found by the load), and so does `list`: one
  // damaged session must neither fail the listing nor vanish from it.
  const root = tempRoot(t)
  const store = addon.openSessionLog(root)
  await writeSessions(store, ['a', 'b', 'c'])
  const before = await store.readStoredRevision('b')
  await store.close()
  damageLastRecord(store, 'b')
  const reopened = addon.openSessionLog(root)
  const listed = JSON.parse(await reopened.listSnapshots())
  assert.deepEqual(listed.map(s => s.header.id), ['a', 'b', 'c'])
  assert.deepEqual(listed.map(s => s.header), JSON.parse(await reopened.list()))
  for (const { header, revision } of listed) {
    assert.equal(await reopened.readStoredRevision(header.id), revision, `${header.id}: readStoredRevision agrees`)
  }
  const damaged = listed[1].revision
  assert.notEqual(damaged, before, 'not the revision of the sound log')
  assert.match(damaged, /^sessionlog:[0-9a-f]{32}:/, 'qualified by the store id')
  await assert.rejects(reopened.loadStored('b'), /^Error: SESSIONLOG_CORRUPT: /)
  assert.equal(JSON.parse(await reopened.listSnapshots())[1].revision, damaged, 'stable while unchanged')
  for (const id of ['a', 'c']) {
    assert.equal(JSON.parse(await reopened.loadStored(id)).revision, listed.find(s => s.header.id === id).revision)
  }
  await reopened.close()
  const again = addon.openSessionLog(root)
  assert.equal(JSON.parse(await again.listSnapshots())[1].revision, damaged, 'stable across reopen')
  await again.close()
})

test('a session deleted while listSnapshots runs is left out, the others are listed', async (t) => {
  const root = tempRoot(t)
  const store = addon.openSessionLog(root)
  await writeSessions(store, ['a', 'b', 'c', 'd'])
  await store.close()
  const reopened = addon.openSessionLog(root)
  // 'b' loaded in this process (as a reader), 'c' not loaded at all: both
  // deleted by another handle after the listing read the sessions directory.
  await reopened.loadStoredFrom('b', 0)
  const listed = JSON.parse(await addon.listSnapshotsDeletingForTest(root, ['b', 'c']))
  assert.deepEqual(listed.map(s => s.header.id), ['a', 'd'])
  for (const { header, revision } of listed) {
    assert.equal(await reopened.readStoredRevision(header.id), revision)
  }
  assert.deepEqual(JSON.parse(await reopened.list()).map(h => h.id), ['a', 'd'])
  assert.equal(await reopened.readStoredRevision('b'), null)
  await reopened.close()
})

test('out of file descriptors, readStoredRevision and listSnapshots reject; no session is reported unreadable', async (t) => {
  // RELIABILITY F68: a process out of descriptors for a moment must not
  // give a sound session the revision of a damaged one (the coordinator
  // would take it as changed, and changed back at the next listing). A
  // child process with a low descriptor limit fills its table, asks, then
  // frees the descriptors and asks again.
  const root = tempRoot(t)
  const store = addon.openSessionLog(root)
  await writeSessions(store, ['a', 'b'])
  const sound = await store.readStoredRevision('b')
  await store.close()
  const script = `
    const fs = require('node:fs')
    const s = require(${JSON.stringify(addonPath)}).openSessionLog(${JSON.stringify(root)})
    const ask = async (what, f) => {
      try { console.log(what + ' ok ' + await f()) } catch (e) { console.log(what + ' rejected ' + e.message) }
    }
    ;(async () => {
      await s.list() // the store open, its session 'b' not loaded
      const fds = []
      try { for (;;) fds.push(fs.openSync('/dev/null', 'r')) } catch (e) { if (e.code !== 'EMFILE') throw e }
      await ask('revision', () => s.readStoredRevision('b'))
      await ask('listing', () => s.listSnapshots())
      for (const fd of fds) fs.closeSync(fd)
      await ask('revision', () => s.readStoredRevision('b'))
      await s.close()
    })().catch(e => { console.log('failed ' + e.stack); process.exit(3) })
  `
  const child = spawnSync('/bin/sh', ['-c', 'ulimit -Sn 256 && exec "$0" -e "$1"', process.execPath, script], { encoding: 'utf8' })
  assert.equal(child.status, 0, child.stdout + child.stderr)
  const lines = child.stdout.trim().split('\n')
  assert.equal(lines.length, 3, child.stdout)
  assert.match(lines[0], /^revision rejected SESSIONLOG_[A-Z_]+: .*(Too many open files|EMFILE)/, 'the transient error, not a revision')
  assert.match(lines[1], /^listing rejected SESSIONLOG_[A-Z_]+: .*(Too many open files|EMFILE)/)
  assert.equal(lines[2], `revision ok ${sound}`, 'the same read succeeds once descriptors are free')
  assert.doesNotMatch(child.stdout, /unreadable/)
})

test('listSnapshots past maxOpenSessions keeps this process\'s sessions its own', async (t) => {
  // Listing must not load the sessions through the store's cache of
  // loaded sessions: that would release this process's idle ones (and
  // their writer locks) to make room, as writing past the limit does.
  const root = tempRoot(t)
  const store = addon.openSessionLog(root, { maxOpenSessions: 2 })
  await writeSessions(store, ['a', 'b', 'c', 'd', 'own'])
  const own = await store.readStoredRevision('own')
  const listed = JSON.parse(await store.listSnapshots())
  assert.deepEqual(listed.map(s => s.header.id), ['a', 'b', 'c', 'd', 'own'])
  assert.equal(listed[4].revision, own)
  const child = spawnSync(process.execPath, ['-e', `
    const s = require(${JSON.stringify(addonPath)}).openSessionLog(${JSON.stringify(root)})
    const meta = JSON.stringify({ version: 0, id: 'own', createdAt: 1000, cwd: '/w' })
    s.appendBatch(meta, JSON.stringify([{ type: 'turn/start', seq: 2, time: 3, data: {} }]), true)
      .then(() => { console.log('wrote'); process.exit(0) }, e => { console.log(e.message); process.exit(3) })
  `], { encoding: 'utf8' })
  assert.equal(child.status, 3, child.stdout + child.stderr)
  assert.match(child.stdout, /^SESSIONLOG_LOCKED: /)
  for (const { header, revision } of listed) {
    assert.equal(await store.readStoredRevision(header.id), revision, header.id)
  }
  // And this process still writes 'own' after the listing.
  await store.appendBatch(JSON.stringify(meta('own')), JSON.stringify([{ type: 'turn/start', seq: 2, time: 3, data: {} }]), true)
  assert.notEqual(await store.readStoredRevision('own'), own)
  await store.close()
})

test('an event over 64 MiB (one huge tool result) is stored and read back, as the harness backends do', async (t) => {
  const root = tempRoot(t)
  const huge = 'r'.repeat(70 << 20)
  const first = [{ type: 'turn/start', seq: 0, time: 1, data: { turn: 1 } }]
  const big = [{ type: 'plugin/probe', seq: 1, time: 2, data: { output: huge }, ignorable: true }]
  const store = addon.openSessionLog(root)
  await store.appendBatch(JSON.stringify(meta('s')), JSON.stringify(first), false)
  await store.appendBatch(JSON.stringify(meta('s')), JSON.stringify(big), true)
  await store.close()
  const reopened = addon.openSessionLog(root)
  const [, events] = await readAll(reopened, 's', 0, 1 << 20)
  assert.equal(events.length, 2)
  assert.equal(events[1].data.output.length, huge.length)
  assert.ok(events[1].data.output === huge, 'the same text')
  await reopened.close()
})

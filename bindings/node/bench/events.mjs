// Deterministic, realistic harness session events in the harness's current
// format (SESSION_FORMAT_VERSION 0, the shapes of
// ../shared/fixtures/harness-current and packages/core/session/src/types.ts):
// turns of user message, steps of request header, streamed reasoning, text
// and tool-call chunks (about 70% of the events, as in real logs), the
// assembled assistant message with usage, tool calls and tool results of a
// few KiB.

const WORDS = [' the', ' file', ' test', ' I', ' will', ' run', ' check', ' output', ' error', ' fix',
  ' build', ' it', ' now', ' then', ' code', ' a', ' function', ' read', ' write', ' result',
  ' passes', ' looks', ' good', ' next', ' src', ' module', ' return', ' value', '.', ',']

/** SplitMix-style 32-bit generator: deterministic for a seed. */
function rng(seed) {
  let s = seed >>> 0
  return (n) => {
    s = (s + 0x9e3779b9) >>> 0
    let z = s
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0
    z = (z ^ (z >>> 16)) >>> 0
    return z % n
  }
}

/**
 * Events of one session, `count` of them (the last turn is cut at `count`
 * only if `count` falls inside it; pass `closed` to end at the last whole
 * turn before `count` instead). Each event is `{ type, seq, time, data,
 * surfaceOp?, sourceEventSeqs? }`, ready for `persistence.append`; a live
 * Session takes `type`, `data` and the surface intent.
 * @param {number} count
 * @param {{ seed?: number, start?: number, closed?: boolean }} [options]
 */
export function sessionEvents(count, options = {}) {
  const below = rng(options.seed ?? 42)
  const words = n => { let s = ''; for (let i = 0; i < n; i++) s += WORDS[below(WORDS.length)]; return s }
  let time = options.start ?? 1_780_000_000_000
  const events = []
  let turnStartLength = 0
  const push = (type, data, surface) => {
    time += 1 + below(40)
    const event = { type, seq: events.length, time, data, ...surface }
    events.push(event)
    return event.seq
  }
  for (let turn = 1; events.length < count; turn++) {
    turnStartLength = events.length
    push('turn/start', { turn })
    const userSeq = push('user/message', {
      id: `u-${turn}`, role: 'user',
      content: [{ type: 'text', text: `Please${words(10 + below(30))}` }],
      source: { kind: 'user' },
    }, { surfaceOp: 'append' })
    if (turn === 1) push('session/title', { title: 'Please fix the build', messageSeqs: [userSeq], source: { kind: 'fallback' } })
    const steps = 1 + below(6)
    for (let step = 1; step <= steps; step++) {
      const last = step === steps
      push('step/start', { turn, step })
      if (step === 1) {
        push('request/header', {
          header: { config: { provider: 'deepseek-official', model: 'deepseek-v4-flash' }, system: `You are a coding agent.${words(80)}` },
          reason: turn === 1 ? 'initial' : 'change',
        })
      }
      const chunk = c => push('assistant/chunk', { turn, step, chunk: c })
      const content = []
      // Reasoning, streamed token by token.
      chunk({ type: 'block-start', index: 0, blockType: 'reasoning' })
      let reasoning = ''
      for (let i = 0, n = 4 + below(24); i < n; i++) {
        const text = WORDS[below(WORDS.length)]
        reasoning += text
        chunk({ type: 'reasoning-delta', index: 0, text })
      }
      chunk({ type: 'block-end', index: 0, block: { type: 'reasoning', text: reasoning } })
      content.push({ type: 'reasoning', text: reasoning })
      // Text.
      chunk({ type: 'block-start', index: 1, blockType: 'text' })
      let text = ''
      for (let i = 0, n = 4 + below(24); i < n; i++) {
        const piece = WORDS[below(WORDS.length)]
        text += piece
        chunk({ type: 'text-delta', index: 1, text: piece })
      }
      chunk({ type: 'block-end', index: 1, block: { type: 'text', text } })
      content.push({ type: 'text', text })
      // A tool call on every step but the last.
      const callId = `call_${turn}_${step}`
      const args = JSON.stringify({ command: `cargo test --${words(3).replaceAll(' ', '-')}` })
      if (!last) {
        chunk({ type: 'block-start', index: 2, blockType: 'tool-call' })
        for (let i = 0; i < args.length; i += 8) {
          chunk({ type: 'tool-call-delta', index: 2, id: callId, name: 'bash', argumentsDelta: args.slice(i, i + 8) })
        }
        content.push({ type: 'tool-call', id: callId, name: 'bash', arguments: args })
      }
      const usage = { inputTokens: 3000 + below(60_000), outputTokens: 50 + below(800), cacheReadTokens: below(50_000), reasoningTokens: 20 + below(200) }
      chunk({ type: 'usage', usage })
      chunk({ type: 'finish', reason: { kind: last ? 'stop' : 'tool-calls' } })
      push('assistant/message', {
        turn, step, usage,
        message: {
          id: `a-${turn}-${step}`, role: 'assistant', content,
          source: { kind: 'model', provider: 'deepseek-official', model: 'deepseek-v4-flash' },
        },
      }, { surfaceOp: 'append' })
      if (!last) {
        const callSeq = push('tool/call', { turn, step, callId, name: 'bash', arguments: args })
        push('tool/result', {
          turn, step,
          message: {
            id: `r-${turn}-${step}`, role: 'user',
            source: { kind: 'tool', callId },
            content: [{ type: 'tool-result', toolCallId: callId, isError: false, content: [{ type: 'text', text: words(100 + below(500)) }] }],
          },
        }, { surfaceOp: 'append', sourceEventSeqs: [callSeq] })
      }
      push('step/end', { turn, step })
    }
    push('turn/end', { turn, reason: { kind: 'completed' } })
  }
  if (options.closed && events.length > count && turnStartLength > 0) events.length = turnStartLength
  return events
}

/** The surface intent of an event, for `Session.append`. */
export function intentOf(event) {
  if (event.surfaceOp === undefined) return undefined
  return event.sourceEventSeqs === undefined
    ? { surfaceOp: event.surfaceOp }
    : { surfaceOp: event.surfaceOp, sourceEventSeqs: event.sourceEventSeqs }
}

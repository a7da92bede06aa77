import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import {
  costText,
  displayOrder,
  endedSessions,
  endedText,
  IdleCountdown,
  isLive,
  isStarting,
  kindText,
  liveCount,
  liveRateText,
  liveSessions,
  noGpuNote,
  progressText,
  rateText,
  sessionOfKernel,
  startedWhen,
  statusText
} from '../src/sessions';
import { session } from './helpers';

describe('order of the cards', () => {
  const list = [
    session({ id: 'old-stopped', state: 'stopped', created_at: 50 }),
    session({ id: 'old-running', state: 'running', created_at: 10 }),
    session({ id: 'new-failed', state: 'failed', created_at: 300 }),
    session({ id: 'new-starting', state: 'starting', created_at: 200 }),
    session({ id: 'mid-stopping', state: 'stopping', created_at: 100 })
  ];

  test('live sessions first, newest first within each group', () => {
    assert.deepEqual(
      displayOrder(list).map(s => s.id),
      ['new-starting', 'mid-stopping', 'old-running', 'new-failed', 'old-stopped']
    );
  });

  test('does not reorder its argument', () => {
    const ids = list.map(s => s.id);
    displayOrder(list);
    assert.deepEqual(
      list.map(s => s.id),
      ids
    );
  });

  test('live count: all but stopped and failed', () => {
    assert.equal(liveCount(list), 3);
    assert.equal(isLive(session({ state: 'requested' })), true);
    assert.equal(liveCount([]), 0);
  });
});

describe('facts of a card', () => {
  test('kind', () => {
    assert.equal(kindText(session()), 't4 × 1 · local');
    assert.equal(
      kindText(session({ gpu_count: 2, backend: 'docker', spot: true, host: 'ssh://box' })),
      't4 × 2 · docker · spot · ssh://box'
    );
    assert.equal(
      kindText(session({ backend: 'docker', image: 'python:3.12-slim' })),
      't4 × 1 · docker · python:3.12-slim'
    );
  });

  test('rate and cost, with the Python formats', () => {
    assert.equal(rateText(session()), '$0.5260/h');
    assert.equal(
      rateText(session({ price_note: 'cloud rate, own hardware' })),
      '$0.5260/h (cloud rate, own hardware)'
    );
    assert.equal(costText(session()), '$0.0158');
    assert.equal(costText(session({ cost_so_far: 1.5, max_cost: 5 })), '$1.50 of $5.00');
    assert.equal(costText(session({ max_cost: 0 })), '$0.0158'); // 0: no cap, as in Python
  });

  test('idle stop: countdown, off, or a dash once ended', () => {
    const at = 1_000_000;
    const text = (view = session(), now = at) => {
      const countdown = new IdleCountdown();
      countdown.see(view.idle.remaining_s, at);
      return countdown.text(view, now);
    };
    assert.equal(text(), '30m00s');
    assert.equal(text(session({ idle: { timeout_s: 1800, remaining_s: 108, warning: null } })), '1m48s');
    assert.equal(
      text(session({ idle: { timeout_s: 1800, remaining_s: 108, warning: null } }), at + 8000),
      '1m40s'
    );
    assert.equal(text(session({ idle: { timeout_s: 1800, remaining_s: null, warning: null } })), '30m00s');
    assert.equal(text(session({ idle: { timeout_s: null, remaining_s: null, warning: null } })), 'off');
    assert.equal(text(session({ state: 'stopped' })), '-');
  });

  test('idle stop: a reply without a fresh countdown keeps counting down', () => {
    const countdown = new IdleCountdown();
    const fresh = session({ idle: { timeout_s: 3600, remaining_s: 3595, warning: null } });
    const stale = session({ idle: { timeout_s: 3600, remaining_s: null, warning: null } });
    countdown.see(fresh.idle.remaining_s, 0);
    assert.equal(countdown.text(fresh, 0), '59m55s');
    countdown.see(stale.idle.remaining_s, 2000); // null: ignored
    assert.equal(countdown.text(stale, 2000), '59m53s');
    assert.equal(countdown.remaining(2000), 3593);
    countdown.see(3600, 4000); // used again: the countdown starts over
    assert.equal(countdown.text(stale, 4000), '1h00m');
  });
});

describe('live sessions, history and the status bar', () => {
  const list = [
    session({ id: 'a', state: 'stopped', created_at: 10, stopped_at: 500 }),
    session({ id: 'b', state: 'running', created_at: 20, kernel_id: 'k1' }),
    session({ id: 'c', state: 'failed', created_at: 30, stopped_at: 40 }),
    session({ id: 'd', state: 'provisioning', created_at: 50, kernel_id: 'k1' }),
    session({ id: 'e', state: 'stopped', created_at: 5, stopped_at: 600, kernel_id: 'k1' })
  ];

  test('live sessions newest first; ended ones by when they ended', () => {
    assert.deepEqual(liveSessions(list).map(s => s.id), ['d', 'b']);
    assert.deepEqual(endedSessions(list).map(s => s.id), ['e', 'a', 'c']);
  });

  test("a kernel's session: its newest live one", () => {
    assert.equal(sessionOfKernel(list, 'k1')?.id, 'd');
    assert.equal(sessionOfKernel(list, 'k2'), undefined);
    assert.equal(sessionOfKernel(list, null), undefined);
  });

  test("a kernel's session: the one it took up last (%gpu use, a GPU kernel), not only one it started", () => {
    const started = session({ id: 'started', kernel_id: 'k1', created_at: 100, kernels: { k1: 100 } });
    const used = session({ id: 'used', kernel_id: 'k2', created_at: 50, kernels: { k2: 50, k1: 200 } });
    assert.equal(sessionOfKernel([started, used], 'k1')?.id, 'used');
    assert.equal(sessionOfKernel([started, used], 'k2')?.id, 'used');
    assert.equal(sessionOfKernel([started, session({ id: 'x', state: 'stopped', kernels: { k1: 300 } })], 'k1')?.id, 'started');
    assert.equal(sessionOfKernel([started], 'k9'), undefined);
  });

  test('a history row says when it started, date and time (local), else when it was asked for', () => {
    const at = new Date(2026, 11, 1, 9, 5, 30).getTime() / 1000;
    assert.equal(startedWhen(session({ started_at: at })), '2026-12-01 09:05');
    assert.equal(startedWhen(session({ started_at: null, created_at: at + 3600 })), '2026-12-01 10:05');
  });

  test("the panel header's total rate: what the live sessions cost per hour together", () => {
    const list = [
      session({ id: 'a', price_per_hour: 0.526 }),
      session({ id: 'b', state: 'starting', price_per_hour: 1.0 }),
      session({ id: 'c', state: 'stopped', price_per_hour: 3.0 })
    ];
    assert.equal(liveRateText(list), '$1.53/h');
    assert.equal(liveRateText([session({ state: 'failed' })]), null);
  });

  test('how it ended', () => {
    assert.equal(
      endedText(session({ state: 'stopped', ended: 'stopped by its idle watchdog after 5s idle' })),
      'stopped by its idle watchdog after 5s idle'
    );
    assert.equal(endedText(session({ state: 'failed', error: 'connect: boom' })), 'connect: boom');
    assert.equal(endedText(session({ state: 'stopped' })), 'stopped');
  });

  test('the stage of a start, from its latest progress line', () => {
    const lines = ['[   0.0s] session t4-1: 1 x t4 on local', '[   0.4s] provision: starting kernel process'];
    assert.equal(
      progressText(session({ state: 'provisioning', progress: lines })),
      'provision: starting kernel process (0.4s)'
    );
    assert.equal(progressText(session({ state: 'running', progress: lines })), null);
    assert.equal(progressText(session({ state: 'starting', progress: null })), null);
    assert.equal(progressText(session({ state: 'requested', progress: ['plain'] })), 'plain');
    assert.equal(isStarting(session({ state: 'requested' })), true);
    assert.equal(isStarting(session({ state: 'stopping' })), false);
  });

  test('status bar text', () => {
    assert.equal(statusText(session(), '29m41s'), 't4 × 1 · $0.0158 · stops in 29m41s');
    assert.equal(statusText(session({ state: 'starting' }), '30m00s'), 't4 × 1 · $0.0158 · starting');
    assert.equal(
      statusText(session({ idle: { timeout_s: null, remaining_s: null, warning: null } }), 'off'),
      't4 × 1 · $0.0158'
    );
  });
});

describe('the no-GPU note', () => {
  test('short, with the detail apart', () => {
    assert.deepEqual(noGpuNote('no NVIDIA GPU visible (LibraryNotFound: NVML Shared Library Not Found)'), {
      text: 'no NVIDIA GPU visible',
      detail: 'LibraryNotFound: NVML Shared Library Not Found'
    });
    assert.deepEqual(noGpuNote(null), { text: 'no NVIDIA GPU visible', detail: '' });
    assert.deepEqual(noGpuNote('something else'), { text: 'something else', detail: '' });
  });
});

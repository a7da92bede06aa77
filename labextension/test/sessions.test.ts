import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import {
  costText,
  displayOrder,
  idleText,
  isLive,
  kindText,
  liveCount,
  rateText
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
  });

  test('rate and cost, with the Python formats', () => {
    assert.equal(rateText(session()), '$0.5260/h');
    assert.equal(costText(session()), '$0.0158');
    assert.equal(costText(session({ cost_so_far: 1.5, max_cost: 5 })), '$1.50 of $5.00');
    assert.equal(costText(session({ max_cost: 0 })), '$0.0158'); // 0: no cap, as in Python
  });

  test('idle stop: countdown, off, or a dash once ended', () => {
    assert.equal(idleText(session()), '30m00s');
    assert.equal(
      idleText(session({ idle: { timeout_s: 1800, remaining_s: 108, warning: null } })),
      '1m48s'
    );
    assert.equal(
      idleText(session({ idle: { timeout_s: 1800, remaining_s: null, warning: null } })),
      '30m00s'
    );
    assert.equal(
      idleText(session({ idle: { timeout_s: null, remaining_s: null, warning: null } })),
      'off'
    );
    assert.equal(idleText(session({ state: 'stopped' })), '-');
  });
});

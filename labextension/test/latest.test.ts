import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { keepNewer, Latest } from '../src/latest';

describe('only the latest load is shown', () => {
  test('an older reply that arrives after a newer one is dropped', async () => {
    const latest = new Latest();
    const shown: string[] = [];
    const load = async (answer: string, delayMs: number): Promise<void> => {
      const ticket = latest.next();
      await new Promise(resolve => setTimeout(resolve, delayMs));
      if (latest.isLatest(ticket)) {
        shown.push(answer);
      }
    };
    await Promise.all([load('before the resume', 30), load('after the resume', 1)]);
    assert.deepEqual(shown, ['after the resume']);
    assert.equal(latest.count, 2);
  });
});

describe("a listing asked before an action's reply does not undo it", () => {
  test("the switch's new session keeps its final name; others take the listing's", () => {
    const shown = [
      { id: 'new', name: 'sw-ui' }, // the switch's reply, after the listing was asked
      { id: 'old', name: 'sw-ui' },
      { id: 'other', name: 'b' }
    ];
    const listed = [
      { id: 'new', name: 'sw-ui-2' }, // its passing name while the switch ran
      { id: 'old', name: 'sw-ui~1' },
      { id: 'other', name: 'b2' }
    ];
    const merged = keepNewer(listed, shown, id => id === 'new');
    assert.deepEqual(merged, [
      { id: 'new', name: 'sw-ui' },
      { id: 'old', name: 'sw-ui~1' },
      { id: 'other', name: 'b2' }
    ]);
  });

  test('a session the listing does not have yet stays; nothing newer: the listing as it is', () => {
    const started = { id: 's', name: 'just-started' };
    assert.deepEqual(keepNewer([{ id: 'a', name: 'a' }], [started], id => id === 's'), [
      started,
      { id: 'a', name: 'a' }
    ]);
    const listed = [{ id: 'a', name: 'a' }];
    assert.deepEqual(keepNewer(listed, [started], () => false), listed);
  });
});

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { Latest } from '../src/latest';

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

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { carryLine, notSavedLine, savedFrom } from '../src/carry';

describe('variables carried to a GPU kernel', () => {
  test('the saved answer is read from the marked line only', () => {
    const text = 'hello\nGPUSESSION_CARRY {"saved": 2, "skipped": [], "committed": true}\n';
    assert.deepEqual(savedFrom(text), { saved: 2, skipped: [], committed: true });
    assert.equal(savedFrom('no mark here'), null);
    assert.equal(savedFrom('GPUSESSION_CARRY {not json'), null);
  });

  test('what moved, the imports, and what did not, with why', () => {
    const line = carryLine('t4-2', {
      restored: ['answer', 'table'],
      imports: ['np'],
      failed: [{ name: 'model', error: 'ModuleNotFoundError: torch' }],
      skipped: [{ name: 'gen', why: 'generator' }]
    });
    assert.equal(
      line,
      'Variables moved into t4-2: answer, table (imports: np); not moved: gen (generator), ' +
        'model (ModuleNotFoundError: torch).'
    );
    assert.equal(
      carryLine('t4-2', { restored: [], imports: [], failed: [], skipped: [] }),
      'No variable moved into t4-2.'
    );
  });

  test('a kernel that could not save says why', () => {
    assert.match(notSavedLine(null)!, /is gpusession installed/);
    assert.equal(
      notSavedLine({ error: 'ModuleNotFoundError: No module named gpusession' }),
      'Variables not moved: the notebook’s kernel could not save them (ModuleNotFoundError: No module named gpusession).'
    );
    assert.equal(notSavedLine({ saved: 1, committed: true }), null);
  });
});

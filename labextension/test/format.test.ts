import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import {
  formatDuration,
  formatFixed,
  formatMetric,
  formatMoney,
  formatRate,
  roundHalfEven
} from '../src/format';
import { endedText } from '../src/sessions';
import { STOP_KINDS, type StopKind } from '../src/types';
import { formatCases, session } from './helpers';

const cases = formatCases();

describe('the Python cases (tests/data/format_cases.json)', () => {
  test('there are cases of both kinds', () => {
    assert.ok(cases.duration.length >= 15);
    assert.ok(cases.money.length >= 15);
  });

  test('formatDuration prints what format_duration prints', () => {
    const wrong = cases.duration
      .map(([input, expected]) => [input, expected, formatDuration(input)])
      .filter(([, expected, got]) => got !== expected);
    assert.deepEqual(wrong, []);
  });

  test('formatMoney prints what format_money prints', () => {
    const wrong = cases.money
      .map(([input, expected]) => [input, expected, formatMoney(input)])
      .filter(([, expected, got]) => got !== expected);
    assert.deepEqual(wrong, []);
  });
});

describe('formatDuration', () => {
  test('the examples of the sidebar', () => {
    assert.equal(formatDuration(108), '1m48s');
    assert.equal(formatDuration(1799.6), '30m00s');
    assert.equal(formatDuration(null), 'off');
  });

  test('a countdown stays short', () => {
    for (const seconds of [0, 59, 3599, 4 * 3600, 99 * 3600 + 3599]) {
      assert.ok(formatDuration(seconds).length <= 6, formatDuration(seconds));
    }
  });

  test('not a number gives a dash', () => {
    assert.equal(formatDuration(Number.NaN), '-');
    assert.equal(formatDuration(Infinity), '-');
  });
});

describe('formatMoney and formatRate', () => {
  test('rates read as in the notebook', () => {
    assert.equal(formatRate(0.526), '$0.5260/h');
    assert.equal(formatRate(32.77), '$32.77/h');
  });

  test('non-finite amounts as Python prints them', () => {
    assert.equal(formatMoney(Number.NaN), '$nan');
    assert.equal(formatMoney(Infinity), '$inf');
    assert.equal(formatMoney(-Infinity), '$-inf');
  });
});

describe('rounding as Python rounds', () => {
  test('roundHalfEven', () => {
    const got = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4999, 2.5001, 7].map(roundHalfEven);
    assert.deepEqual(got.map(n => n + 0), [-2, -2, 0, 0, 2, 2, 2, 3, 7]);
  });

  test('formatFixed breaks exact ties to even, others to nearest', () => {
    assert.equal(formatFixed(0.125, 2), '0.12'); // exact tie
    assert.equal(formatFixed(0.375, 2), '0.38'); // exact tie
    assert.equal(formatFixed(2.675, 2), '2.67'); // just below the tie in binary
    assert.equal(formatFixed(1.005, 2), '1.00');
    assert.equal(formatFixed(1234567.5, 0), '1,234,568');
    assert.equal(formatFixed(1234566.5, 0), '1,234,566');
    assert.equal(formatFixed(-0.00001, 4), '-0.0000');
    assert.equal(formatFixed(999999.999, 2), '1,000,000.00');
  });
});

describe('the metrics (gpusession.configuration.metrics)', () => {
  test('every row of the table has cases', () => {
    const keys = new Set(cases.metrics.cases.map(([key]) => key));
    assert.deepEqual([...keys].sort(), cases.metrics.table.map(m => m.key).sort());
  });

  test('formatMetric prints what metric_text prints, with the served row', () => {
    const wrong = cases.metrics.cases
      .map(([key, value, limit, expected]) => {
        const metric = cases.metrics.table.find(m => m.key === key)!;
        return [key, value, limit, expected, formatMetric(metric, value, limit)];
      })
      .filter(([, , , expected, got]) => got !== expected);
    assert.deepEqual(wrong, []);
  });

  test('not a number reads n/a', () => {
    const util = cases.metrics.table.find(m => m.key === 'util')!;
    assert.equal(formatMetric(util, Number.NaN), 'n/a');
    assert.equal(formatMetric(util, 57, Number.NaN), '57%');
  });
});

describe('the stop kinds (gpusession.core.protocol.StopKind)', () => {
  test('STOP_KINDS is the protocol list, Slurm kinds included', () => {
    assert.deepEqual([...STOP_KINDS], cases.stop_kinds);
    for (const kind of ['time-limit', 'preempted', 'job-ended']) {
      assert.ok((STOP_KINDS as readonly string[]).includes(kind), kind);
    }
  });

  test('a session the scheduler ended says why in the history', () => {
    const reasons: [StopKind, string][] = [
      ['time-limit', 'the cluster ended its job at the job\'s time limit (1h01m)'],
      ['preempted', 'the cluster preempted its job for another'],
      ['job-ended', 'the cluster ended its job: NODE_FAIL']
    ];
    for (const [kind, text] of reasons) {
      const view = session({ state: 'stopped', stop_reason: { kind, text } });
      assert.equal(endedText(view), text);
    }
  });
});

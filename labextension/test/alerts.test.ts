import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { SessionAlerts } from '../src/alerts';
import type { SessionView } from '../src/types';
import { session } from './helpers';

function alerts(): [SessionAlerts, string[]] {
  const said: string[] = [];
  return [new SessionAlerts((kind, text) => said.push(`${kind}: ${text}`)), said];
}

const idleStop = {
  kind: 'idle',
  text: 'after 6s idle'
} as SessionView['stop_reason'];

describe('later notices go to JupyterLab notifications', () => {
  test('a session seen running that its watchdog stopped is said once', () => {
    const [watch, said] = alerts();
    watch.see([session({ id: 'a', name: 'sleepy', state: 'running' })]);
    const ended = session({
      id: 'a',
      name: 'sleepy',
      state: 'stopped',
      stop_reason: idleStop,
      ended: 'stopped by its idle watchdog after 6s idle'
    });
    watch.see([ended]);
    watch.see([ended]);
    assert.deepEqual(said, ['info: GPU session sleepy: stopped by its idle watchdog after 6s idle']);
  });

  test("a stop made in this sidebar says its own line, not this one", () => {
    const [watch, said] = alerts();
    watch.see([session({ id: 'b', state: 'running' })]);
    watch.see([
      session({
        id: 'b',
        state: 'stopped',
        stop_reason: { kind: 'user', text: 'stopped by the JupyterLab sidebar', by: 'the JupyterLab sidebar' },
        ended: 'stopped by the JupyterLab sidebar'
      })
    ]);
    assert.deepEqual(said, []);
  });

  test('an ended session never seen running here is history, not news', () => {
    const [watch, said] = alerts();
    watch.see([session({ id: 'c', state: 'stopped', ended: 'stopped by gpusession stop' })]);
    assert.deepEqual(said, []);
  });

  test('the budget is said once per level while the session runs', () => {
    const [watch, said] = alerts();
    const warn = { level: 'warn', text: "this month's GPU spend $8.50 is 85%" };
    watch.see([session({ id: 'd', name: 'b', state: 'running', budget_alert: warn })]);
    watch.see([session({ id: 'd', name: 'b', state: 'running', budget_alert: warn })]);
    assert.deepEqual(said, ["warning: GPU session b: this month's GPU spend $8.50 is 85%"]);
  });
});

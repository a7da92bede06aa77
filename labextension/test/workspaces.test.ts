import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import type { WorkspaceView } from '../src/types';
import {
  deleteBlocked,
  deleteQuestion,
  resumeOffer,
  resumeTitle,
  stopQuestion,
  workspaceLine,
  workspacesTitle
} from '../src/workspaces';
import { session } from './helpers';

function workspace(fields: Partial<WorkspaceView> = {}): WorkspaceView {
  return {
    name: 'w1',
    backend: 'local',
    where: '/home/u/.local/share/gpusession/workspaces/w1',
    size_bytes: 12000,
    size: '12 kB',
    monthly_cost: null,
    cost_per_month: null,
    sessions: ['w1'],
    active: [],
    in_use: false,
    used_by: 'none left',
    ...fields
  };
}

describe('resume offer of an ended session', () => {
  const body = { type: 't4', backend: 'local', idle: '30s', resume: 'w1' };

  test('offered when its stop saved: the resume body, naming the workspace', () => {
    const offer = resumeOffer(session({ state: 'stopped', resume: body }));
    assert.deepEqual(offer, { workspace: 'w1', body });
    assert.equal(
      resumeTitle(offer!),
      'Start a new session on workspace w1 and restore the variables its stop saved'
    );
  });

  test('none without a save, while active, or with a body naming no workspace', () => {
    assert.equal(resumeOffer(session({ state: 'stopped', resume: null })), null);
    assert.equal(resumeOffer(session({ state: 'running', resume: body })), null);
    assert.equal(resumeOffer(session({ state: 'stopped', resume: { type: 't4' } })), null);
    assert.equal(resumeOffer(session({ state: 'stopped', resume: { type: 't4', resume: '' } })), null);
  });

  test('the fresh restart body stays as it is', () => {
    const view = session({ state: 'stopped', resume: body });
    resumeOffer(view);
    assert.deepEqual(view.restart, { type: 't4', backend: 'local', idle: '1800s' });
  });
});

describe('workspaces list words', () => {
  test('backend, size, users; a monthly cost only when it has one', () => {
    assert.equal(workspaceLine(workspace()), 'local · 12 kB · used by: none left');
    assert.equal(
      workspaceLine(workspace({ backend: 'aws', cost_per_month: '$0.80', used_by: 'w2 (active)' })),
      'aws · 12 kB · $0.80/month · used by: w2 (active)'
    );
  });

  test('delete asks with where and size, and is blocked while in use', () => {
    assert.equal(
      deleteQuestion(workspace()),
      'Delete workspace w1 (/home/u/.local/share/gpusession/workspaces/w1, 12 kB)? ' +
        'Its files and saved variables are gone for good.'
    );
    assert.equal(deleteBlocked(workspace()), null);
    assert.equal(
      deleteBlocked(workspace({ in_use: true, used_by: 'w2 (active)' })),
      'In use by w2 (active): stop the session first'
    );
  });

  test('title counts them', () => {
    assert.equal(workspacesTitle([]), 'Workspaces (0)');
    assert.equal(workspacesTitle([workspace(), workspace({ name: 'w2' })]), 'Workspaces (2)');
  });
});

describe('the question before a stop', () => {
  test('with a workspace: says what Save and stop keeps, and what Stop ends', () => {
    assert.equal(
      stopQuestion(session({ name: 'ux-nb', workspace: 'ux-nb' })),
      "Stop ux-nb (t4 × 1 · local, $0.0158 so far)? Save and stop keeps the kernel's variables in " +
        "workspace ux-nb, to Resume later; Stop ends them (the workspace's files stay)."
    );
  });

  test('without one: the kernel and its variables end', () => {
    assert.equal(
      stopQuestion(session({ workspace: null })),
      'Stop one (t4 × 1 · local, $0.0158 so far)? Its kernel and variables end.'
    );
  });
});

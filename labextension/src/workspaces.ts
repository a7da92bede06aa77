/**
 * Workspaces in the sidebar, without a DOM: what an ended session's card
 * offers to resume, and the words of the workspaces list. The words of a
 * save ("saved 2 variables, 1 kB; ...") and of a size are the server's.
 */
import { formatMoney } from './format';
import { kindText } from './sessions';
import type { SessionView, StartRequest, WorkspaceView } from './types';

/** What an ended session's card offers besides Start again. */
export interface ResumeOffer {
  /** The workspace its stop saved the variables into. */
  workspace: string;
  /** The POST `sessions` body that resumes it. */
  body: StartRequest;
}

/** Resume is offered only for an ended session whose stop saved (the server
 * sends a `resume` body then, naming the workspace). */
export function resumeOffer(view: SessionView): ResumeOffer | null {
  const body = view.resume;
  if (!body || view.state === 'running' || view.state === 'starting') {
    return null;
  }
  const workspace = body.resume;
  return typeof workspace === 'string' && workspace ? { workspace, body } : null;
}

/** The Resume button's hover text. */
export function resumeTitle(offer: ResumeOffer): string {
  return `Start a new session on workspace ${offer.workspace} and restore the variables its stop saved`;
}

/** One workspace's second line: "local · 12 kB · $0.80/month · used by: none left". */
export function workspaceLine(ws: WorkspaceView): string {
  const parts = [ws.backend, ws.size];
  if (ws.cost_per_month) {
    parts.push(`${ws.cost_per_month}/month`);
  }
  parts.push(`used by: ${ws.used_by}`);
  return parts.join(' · ');
}

/** The question before a delete. */
export function deleteQuestion(ws: WorkspaceView): string {
  return (
    `Delete workspace ${ws.name} (${ws.where}, ${ws.size})? ` +
    'Its files and saved variables are gone for good.'
  );
}

/** Why a workspace cannot be deleted now, or null when it can. */
export function deleteBlocked(ws: WorkspaceView): string | null {
  return ws.in_use ? `In use by ${ws.used_by}: stop the session first` : null;
}

/** The section's title: "Workspaces (3)". */
export function workspacesTitle(list: readonly WorkspaceView[]): string {
  return `Workspaces (${list.length})`;
}

/** The button that saves the kernel's variables into the workspace, then stops. */
export const SAVE_AND_STOP = 'Save and stop';

/** The question before a stop, saying what Save and stop keeps. */
export function stopQuestion(session: SessionView): string {
  const what = `${session.name} (${kindText(session)}, ${formatMoney(session.cost_so_far)} so far)`;
  if (!session.workspace) {
    return `Stop ${what}? Its kernel and variables end.`;
  }
  return (
    `Stop ${what}? ${SAVE_AND_STOP} keeps the kernel's variables in workspace ` +
    `${session.workspace}, to Resume later; Stop ends them (the workspace's files stay).`
  );
}

/**
 * The question before a stop: a session that has a workspace offers Save and
 * stop (its kernel's variables go into the workspace first, for Resume), Stop
 * and Cancel; one without asks Stop or Cancel. Stop is the danger button.
 * Shared by a card's Stop and the palette's "Stop a GPU Session…".
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { formatMoney } from './format';
import { kindText } from './sessions';
import type { SessionView } from './types';
import { SAVE_AND_STOP, stopQuestion } from './workspaces';

/** What the user chose: save first, stop only, or nothing. */
export type StopChoice = 'save' | 'stop' | null;

/**
 * Ask how to stop one of `sessions` (live ones, the one to name first at the
 * head): with more than one, a pick list shows above the question.
 */
export async function askStop(
  sessions: readonly [SessionView, ...SessionView[]]
): Promise<{ choice: StopChoice; session: SessionView }> {
  const body = new Widget();
  body.addClass('gpusession-stop-dialog');
  const question = document.createElement('p');
  question.className = 'gpusession-stop-question';
  const select = document.createElement('select');
  select.className = 'gpusession-stop-pick jp-mod-styled';
  sessions.forEach((view, index) => {
    const entry = document.createElement('option');
    entry.value = String(index);
    entry.textContent = `${view.name} (${kindText(view)}, ${formatMoney(view.cost_so_far)})`;
    select.append(entry);
  });
  const chosen = (): SessionView => sessions[Number(select.value)] ?? sessions[0];
  const show = () => {
    question.textContent = stopQuestion(chosen());
    const save = body.node.closest('.jp-Dialog')?.querySelector<HTMLButtonElement>('.gpusession-save-and-stop');
    if (save) {
      save.disabled = !chosen().workspace; // nothing to save into
    }
  };
  select.addEventListener('change', show);
  if (sessions.length > 1) {
    body.node.append(select);
  }
  body.node.append(question);
  show();
  const anySave = sessions.some(view => view.workspace);
  const stop = Dialog.warnButton({ label: 'Stop', className: 'gpusession-stop-only' });
  const save = Dialog.okButton({ label: SAVE_AND_STOP, className: 'gpusession-save-and-stop' });
  const pending = showDialog({
    title: 'Stop a GPU session',
    body,
    buttons: anySave ? [Dialog.cancelButton(), stop, save] : [Dialog.cancelButton(), stop],
    defaultButton: 0 // Enter cancels: neither stop happens by a stray key
  });
  window.requestAnimationFrame(show); // the buttons exist once the dialog is attached
  const answer = await pending;
  const session = chosen();
  if (!answer.button.accept) {
    return { choice: null, session };
  }
  const saving = answer.button.label === SAVE_AND_STOP && Boolean(session.workspace);
  return { choice: saving ? 'save' : 'stop', session };
}

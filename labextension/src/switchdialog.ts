/**
 * "Switch GPU…" on a running session's card: a dialog with the options a
 * switch takes (type, backend, spot, image, host, region: the start form's
 * served fields, with their help), then POST `sessions/<id>/switch`. The
 * server saves the kernel's variables into the workspace, starts the new
 * session on it and restores them, and stops the old one only once the new
 * one answered; when the new one cannot start, the old one keeps running.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { Field, makeField } from './form';
import { appliesTo, FieldValue, initialValue } from './options';
import { currentValues, SWITCH_OPTIONS, switchBody } from './switchbody';
import type { OptionView, SessionView, SwitchRequest } from './types';

/**
 * Ask where to move `view`: the switch body, or null when cancelled or
 * nothing was changed. `options` are the served start options (GET `options`).
 */
export async function askSwitch(
  view: SessionView,
  options: readonly OptionView[]
): Promise<SwitchRequest | null> {
  const offered = SWITCH_OPTIONS.map(name => options.find(option => option.name === name)).filter(
    (option): option is OptionView => option !== undefined
  );
  const now = currentValues(view);
  const fields = new Map<string, Field>();
  const body = new Widget();
  body.addClass('gpusession-switch-dialog');
  const intro = document.createElement('p');
  intro.className = 'gpusession-switch-intro';
  intro.textContent =
    `The variables of ${view.name} are saved into workspace ${view.workspace ?? view.name}, ` +
    'a new session starts on it and restores them, then ' +
    `${view.name} stops. If the new one cannot start, ${view.name} keeps running untouched.`;
  const list = document.createElement('div');
  list.className = 'gpusession-fields';
  for (const option of offered) {
    const field = makeField(option);
    const value = now.get(option.name) ?? initialValue(option);
    const { input } = field;
    if (input instanceof HTMLInputElement && input.type === 'checkbox') {
      input.checked = value === true;
    } else if (input instanceof HTMLSelectElement) {
      const text = String(value);
      if (!Array.from(input.options).some(entry => entry.value === text)) {
        const entry = document.createElement('option');
        entry.value = entry.textContent = text; // a configured type such as "a100:8"
        input.prepend(entry);
      }
      input.value = text;
    } else {
      input.value = String(value);
    }
    fields.set(option.name, field);
    list.append(field.node);
  }
  const values = (): Map<string, FieldValue> => {
    const found = new Map<string, FieldValue>();
    for (const [name, { input }] of fields) {
      found.set(
        name,
        input instanceof HTMLInputElement && input.type === 'checkbox' ? input.checked : input.value
      );
    }
    return found;
  };
  const nothing = document.createElement('div');
  nothing.className = 'gpusession-switch-nothing';
  const show = () => {
    const backend = String(values().get('backend') ?? view.backend);
    for (const field of fields.values()) {
      field.node.hidden = !appliesTo(field.option, backend);
    }
    const unchanged = Object.keys(switchBody(offered, values(), view)).length === 0;
    nothing.textContent = unchanged ? 'Change at least one field: it would start the same session.' : '';
    nothing.hidden = !unchanged;
    const button = body.node
      .closest('.jp-Dialog')
      ?.querySelector<HTMLButtonElement>('.gpusession-switch-confirm');
    if (button) {
      button.disabled = unchanged;
    }
  };
  list.addEventListener('input', show);
  list.addEventListener('change', show);
  body.node.append(intro, list, nothing);
  show();
  const pending = showDialog({
    title: `Switch ${view.name} to another GPU`,
    body,
    buttons: [
      Dialog.cancelButton(),
      Dialog.okButton({ label: 'Switch', className: 'gpusession-switch-confirm' })
    ],
    defaultButton: 0
  });
  window.requestAnimationFrame(show); // the buttons exist once the dialog is attached
  const answer = await pending;
  if (!answer.button.accept) {
    return null;
  }
  const request = switchBody(offered, values(), view);
  return Object.keys(request).length ? request : null;
}

/**
 * The one line of each switch this page made, for the new session's card
 * (made after the reply, at the next list): taken once.
 */
const switchLines = new Map<string, string>();

export function keepSwitchLine(id: string, line: string): void {
  switchLines.set(id, line);
}

export function takeSwitchLine(id: string): string | null {
  const line = switchLines.get(id) ?? null;
  switchLines.delete(id);
  return line;
}

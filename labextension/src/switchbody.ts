/**
 * The body of a switch (POST `sessions/<id>/switch`) from the switch
 * dialog's fields, without a DOM: what differs from the session now.
 */
import { appliesTo, FieldValue } from './options';
import type { OptionView, SessionView, SwitchRequest } from './types';

/** The start options a switch offers, in this order (`%gpu switch --type ...`). */
export const SWITCH_OPTIONS: readonly string[] = [
  'type',
  'backend',
  'spot',
  'image',
  'host',
  'region'
];

/** What the session runs now, as the switch fields write it. */
export function currentValues(view: SessionView): Map<string, FieldValue> {
  const type = view.gpu_count > 1 ? `${view.gpu_type}:${view.gpu_count}` : view.gpu_type;
  return new Map<string, FieldValue>([
    ['type', type],
    ['backend', view.backend],
    ['spot', view.spot],
    ['image', view.image ?? ''],
    ['host', view.host ?? ''],
    ['region', '']
  ]);
}

/**
 * The switch body: only what differs from the session now (the server
 * keeps the rest of its options), for the options of the chosen backend.
 * Spot unticked on a spot session is `on_demand`; an emptied host goes back
 * to the default engine.
 */
export function switchBody(
  options: readonly OptionView[],
  values: ReadonlyMap<string, FieldValue>,
  view: SessionView
): SwitchRequest {
  const now = currentValues(view);
  const backend = String(values.get('backend') ?? view.backend);
  const body: SwitchRequest = {};
  for (const option of options) {
    const value = values.get(option.name);
    if (value === undefined || !appliesTo(option, backend)) {
      continue;
    }
    const was = now.get(option.name);
    if (typeof value === 'boolean') {
      if (option.name === 'spot' && was === true && !value) {
        body.on_demand = true;
      } else if (value !== was) {
        body[option.name] = value;
      }
      continue;
    }
    const text = value.trim();
    if (text !== String(was ?? '').trim()) {
      body[option.name] = text;
    }
  }
  return body;
}

/**
 * Where a switch asks to go, in words, for its card until the server's first
 * stage: "a100 on local", "a10g:2 on aws (on demand)".
 */
export function switchWhere(view: SessionView, body: SwitchRequest): string {
  const now = currentValues(view);
  const type = String(body.type ?? now.get('type'));
  const backend = String(body.backend ?? view.backend);
  const how = body.on_demand === true ? ' (on demand)' : body.spot === true ? ' (spot)' : '';
  return `${type} on ${backend}${how}`;
}

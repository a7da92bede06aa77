/**
 * The start form's logic, without a DOM: which served options it shows, with
 * which control and initial value, and the request body its values make.
 *
 * The option table (GET `options`) is the server's; the form keeps no list of
 * options, no defaults and no validation of its own (POST `options/check`
 * says what is wrong with a value).
 */
import type { OptionView, StartRequest } from './types';

/** What a field holds: a text box's or select's text, or a checkbox's state. */
export type FieldValue = string | boolean;

/** The control a field is shown with. */
export type ControlKind = 'select' | 'checkbox' | 'text';

/** After a successful start these go back to their initial value (a session
 * name cannot be used twice). */
export const RESET_AFTER_START: readonly string[] = ['name'];

/** The options the form shows, in the server's order. */
export function formOptions(options: readonly OptionView[]): OptionView[] {
  return options.filter(option => option.form);
}

export function controlKind(option: OptionView): ControlKind {
  switch (option.kind) {
    case 'gpu_type':
    case 'backend':
    case 'choice':
      return 'select';
    case 'bool':
      return 'checkbox';
    default:
      return 'text';
  }
}

/** The field's class, also its `data-testid`: "gpusession-max-cost-input". */
export function controlClass(option: OptionView): string {
  const slug = option.name.replace(/[^A-Za-z0-9]+/g, '-').toLowerCase();
  return `gpusession-${slug}-${controlKind(option) === 'select' ? 'select' : 'input'}`;
}

/**
 * The entries of a select: its choices, after an empty "no value" entry
 * when the option has no default and is a free `choice` (a GPU type or a
 * backend is always one of the list), or after the default when that is not
 * one of them (a configured type such as "a100:8").
 */
export function selectChoices(option: OptionView): string[] {
  const choices = option.choices ?? [];
  const value = option.default;
  if (option.kind === 'choice' && value === null) {
    return ['', ...choices];
  }
  if (typeof value === 'string' && value && !choices.includes(value)) {
    return [value, ...choices];
  }
  return [...choices];
}

/** What a field starts with: the served default (the user's config applied). */
export function initialValue(option: OptionView): FieldValue {
  const value = option.default;
  if (controlKind(option) === 'checkbox') {
    return value === true || value === 'true';
  }
  if (value === null) {
    return controlKind(option) === 'select' ? (selectChoices(option)[0] ?? '') : '';
  }
  return typeof value === 'boolean' ? String(value) : value;
}

/** The option that picks the backend, if the server has one. */
export function backendOption(options: readonly OptionView[]): OptionView | undefined {
  return options.find(option => option.kind === 'backend');
}

/** The option that picks the GPU type, if the server has one. */
export function gpuTypeOption(options: readonly OptionView[]): OptionView | undefined {
  return options.find(option => option.kind === 'gpu_type');
}

/** Whether the option applies with this backend (null: none chosen). */
export function appliesTo(option: OptionView, backend: string | null): boolean {
  return option.backends === null || backend === null || option.backends.includes(backend);
}

/** The backend the values pick, or null when no option picks one. */
export function selectedBackend(
  options: readonly OptionView[],
  values: ReadonlyMap<string, FieldValue>
): string | null {
  const option = backendOption(options);
  if (!option) {
    return null;
  }
  const value = values.get(option.name);
  return typeof value === 'string' && value ? value : null;
}

/** The options shown with these values: the form's, for the chosen backend. */
export function visibleOptions(
  options: readonly OptionView[],
  values: ReadonlyMap<string, FieldValue>
): OptionView[] {
  const backend = selectedBackend(options, values);
  return formOptions(options).filter(option => appliesTo(option, backend));
}

/**
 * The body of POST `sessions` (and `options/check`): every visible field,
 * text trimmed; empty text is left out so that the server's default applies.
 * A checkbox always says what it shows.
 */
export function requestBody(
  options: readonly OptionView[],
  values: ReadonlyMap<string, FieldValue>
): StartRequest {
  const body: StartRequest = {};
  for (const option of visibleOptions(options, values)) {
    const value = values.get(option.name) ?? initialValue(option);
    if (controlKind(option) === 'checkbox') {
      body[option.name] = value === true;
    } else {
      const text = String(value).trim();
      if (text) {
        body[option.name] = text;
      }
    }
  }
  return body;
}

/**
 * The errors of POST `options/check`, split into those a shown field can
 * carry and the rest (as "Label: message" lines for the form's error).
 */
export function splitErrors(
  errors: Readonly<Record<string, string>>,
  shown: readonly OptionView[],
  all: readonly OptionView[] = shown
): { fields: Map<string, string>; other: string[] } {
  const shownNames = new Set(shown.map(option => option.name));
  const fields = new Map<string, string>();
  const other: string[] = [];
  for (const [name, text] of Object.entries(errors)) {
    if (shownNames.has(name)) {
      fields.set(name, text);
    } else {
      const label = all.find(option => option.name === name)?.label ?? name;
      other.push(`${label}: ${text}`);
    }
  }
  return { fields, other };
}

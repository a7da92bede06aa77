/**
 * DOM helpers shared by the panel's parts. Every setter writes only when the
 * value changed, so that polling every two seconds does not churn the DOM.
 */

/** A new element with a class. */
export function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  return node;
}

/** A new element whose class doubles as its `data-testid`. */
export function control<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string
): HTMLElementTagNameMap[K] {
  const node = element(tag, className);
  node.dataset.testid = className;
  return node;
}

/** A note shown only while it has text (see `showText`); starts hidden. */
export function message(className: string): HTMLDivElement {
  const node = control('div', className);
  node.hidden = true;
  return node;
}

/**
 * Set a node's text. What the server's words quote as code ("resume with
 * `%gpu start --resume ux-nb`") shows as code, without the backticks.
 */
export function setText(node: HTMLElement, text: string): void {
  const parts = text.split('`');
  if (parts.length < 3) {
    if (node.dataset.text !== undefined) {
      delete node.dataset.text;
      node.textContent = text;
    } else if (node.textContent !== text) {
      node.textContent = text;
    }
    return;
  }
  if (node.dataset.text === text) {
    return;
  }
  node.dataset.text = text;
  // an odd part is code; a last backtick without its pair stays as it is
  const pieces = parts.map((part, i) => {
    if (i % 2 === 0) {
      return part;
    }
    if (i === parts.length - 1) {
      return `\`${part}`;
    }
    // a line may end between its words, never inside one ("--resume" stays whole)
    const code = document.createElement('code');
    code.className = 'gpusession-code';
    part.split(' ').forEach((word, j) => {
      const whole = document.createElement('span');
      whole.className = 'gpusession-code-word';
      whole.textContent = word;
      code.append(...(j ? [' ', whole] : [whole]));
    });
    return code;
  });
  node.replaceChildren(...pieces);
}

export function setData(node: HTMLElement, key: string, value: string): void {
  if (node.dataset[key] !== value) {
    node.dataset[key] = value;
  }
}

export function setClass(node: Element, className: string): void {
  if (node.getAttribute('class') !== className) {
    node.setAttribute('class', className);
  }
}

/** Show a message, or hide the node when there is none. */
export function showText(node: HTMLElement, text: string | null): void {
  setText(node, text ?? '');
  if (node.hidden !== !text) {
    node.hidden = !text;
  }
}

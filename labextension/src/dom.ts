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
    if (node.dataset.text !== undefined || node.textContent !== text) {
      delete node.dataset.text;
      node.replaceChildren(...breakable(text));
    }
    return;
  }
  if (node.dataset.text === text) {
    return;
  }
  node.dataset.text = text;
  // an odd part is code; a last backtick without its pair stays as it is
  const pieces = parts.flatMap((part, i): (string | Node)[] => {
    if (i % 2 === 0) {
      return breakable(part);
    }
    if (i === parts.length - 1) {
      return breakable(`\`${part}`);
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
    return [code];
  });
  node.replaceChildren(...pieces);
}

/** How long a run without spaces is before it may end a line after a '/'. */
const LONG_WORD = 16;

/**
 * Text whose long words may end a line after each '/': an image reference, a
 * host or a path ("registry.example.com/team/image:tag", "ssh://user@host")
 * wraps between its parts at the sidebar's 250 px rather than mid-word ("$0.5260/h"
 * stays whole). A `<wbr>` is no character: the text copied is the text.
 */
function breakable(text: string): (string | Node)[] {
  if (!text.includes('/')) {
    return [text];
  }
  const pieces: (string | Node)[] = [];
  let plain = '';
  for (const word of text.split(/(\s+)/)) {
    if (word.length < LONG_WORD || !word.includes('/')) {
      plain += word;
      continue;
    }
    word.split(/(?<=\/)(?!\/)/).forEach((part, i) => {
      if (i) {
        pieces.push(plain, document.createElement('wbr'));
        plain = '';
      }
      plain += part;
    });
  }
  pieces.push(plain);
  return pieces.filter(piece => piece !== '');
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

/**
 * The sidebar icon: a chip with pins, themed like JupyterLab's own icons.
 */
import { LabIcon } from '@jupyterlab/ui-components';

const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M7 7h10v10H7z" opacity="0.35"/>
    <path d="M5 5h14v14H5zm2 2v10h10V7z"/>
    <path d="M8 1h2v3H8zm6 0h2v3h-2zM8 20h2v3H8zm6 0h2v3h-2zM1 8h3v2H1zm0 6h3v2H1zm19-6h3v2h-3zm0 6h3v2h-3z"/>
  </g>
</svg>`;

export const gpuIcon = new LabIcon({ name: 'gpusession:gpu', svgstr: svg });

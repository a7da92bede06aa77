import './base.css';
import './spend.css';

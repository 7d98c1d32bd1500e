mod audit;
mod run;
mod script;
mod ssh;
mod support;
